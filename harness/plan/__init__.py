"""Planning: the cells to run (scenario x variant x device x world size) and where each runs in a launch."""
