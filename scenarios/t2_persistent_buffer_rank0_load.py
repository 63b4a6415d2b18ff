"""T, the control: the same rank-0 checkpoint load with the rotary buffer persistent.

The buffer is in the checkpoint, so ``set_model_state_dict(..., broadcast_from_rank0=True)``
writes it on every rank and every value matches the single-process run: what breaks
``t_buffer_after_rank0_load`` is the buffer missing from the checkpoint, not the load.
"""

from harness.spec import Scenario, Sharding, mean_square
from scenarios.t_buffer_after_rank0_load import RotaryMLP, batch

SCENARIO = Scenario(
    model=lambda: RotaryMLP(persistent=True),
    batch=batch,
    forward=lambda model, x, ctx: mean_square(model(x)),
    sharding=Sharding(units=("inp",), init="rank0"),
)
