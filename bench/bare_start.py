"""A bare torchrun start, the floor the harness's launch is measured against: every rank
joins a gloo process group, meets the others at a barrier and leaves.

    python -m torch.distributed.run --standalone --nproc-per-node 4 bench/bare_start.py
"""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
