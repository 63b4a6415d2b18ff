"""Process control: processes that die with their parent, whole trees ended, crash logs read, GPU slices, a core per rank."""
