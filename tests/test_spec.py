import pytest
import torch

from harness.spec import Ctx, Expect, MicroBatch, Scenario, Sharding, accumulate, torch_release
from scenarios._models import MLP, randn_batch


def _scenario(**kw):
    return Scenario(name="s", summary="", model=MLP, batch=randn_batch(), **kw)


def test_accumulate_syncs_only_last():
    assert [m.sync for m in accumulate(3)] == [False, False, True]


def test_last_micro_batch_must_sync():
    with pytest.raises(ValueError, match="last micro-batch"):
        _scenario(schedule=(MicroBatch(sync=False),))


def test_a_hook_that_reduces_after_the_window_wants_every_micro_batch_unsynced():
    from harness.train.hooks import ReduceAfterWindow

    assert _scenario(schedule=accumulate(2, last_sync=False), hooks=(ReduceAfterWindow(),)).hooks
    with pytest.raises(ValueError, match=r"ReduceAfterWindow runs every micro-batch with gradient sync off"):
        _scenario(schedule=accumulate(2), hooks=(ReduceAfterWindow(),))


def test_hsdp_mesh_shape_and_bad_world_size():
    assert Sharding(replicate=2).mesh_shape(4) == (2, 2)
    assert Sharding().mesh_shape(3) == (3,)
    with pytest.raises(ValueError, match="not divisible"):
        _scenario(sharding=Sharding(replicate=2), world_sizes=(3,))


def test_expect_unknown_status_and_bad_range():
    with pytest.raises(ValueError, match="unknown status"):
        Expect(status="fine")
    with pytest.raises(ValueError, match="bad version range"):
        Expect(status="pass", torch="2.15")


@pytest.mark.parametrize(
    "version,expected",
    [("2.13.0+cpu", "error"), ("2.14.1", "error"), ("2.15.0", "pass"), ("2.16.0.dev20261101", "pass")],
)
def test_expected_picks_first_matching_range(version, expected):
    s = _scenario(expect=(Expect(status="error", torch="<2.15", match="x"),))
    assert s.expected(variant="vanilla", torch_version=version, device="cpu", world_size=2).status == (expected,)
    # patched defaults to pass whatever the vanilla expectation
    assert s.expected(variant="patched", torch_version=version, device="cpu", world_size=2).status == ("pass",)


def test_expect_filters_device_and_world_size():
    s = _scenario(expect=(Expect(status="hang|crash", devices=("cuda",), world_sizes=(2,),
                                 match={"hang": "no result", "crash": "died"}),))
    assert s.expected(variant="vanilla", torch_version="2.13.0", device="cuda", world_size=2).status == ("hang", "crash")
    assert s.expected(variant="vanilla", torch_version="2.13.0", device="cpu", world_size=2).status == ("pass",)
    assert s.expected(variant="vanilla", torch_version="2.13.0", device="cuda", world_size=4).status == ("pass",)


def test_expect_covers_several_variants():
    both = Expect(status="error", variants=("vanilla", "patched"))
    s = _scenario(expect=(both,))
    assert {s.expected(variant=v, torch_version="2.13.0", device="cpu", world_size=2).status
            for v in ("vanilla", "patched")} == {("error",)}
    with pytest.raises(ValueError, match="unknown variant 'patchd'"):
        Expect(status="error", variants=("patchd",))


def test_batch_seed_differs_by_rank_step_micro_batch():
    s = _scenario()
    seeds = {s.batch_seed(Ctx(rank=r, world_size=2, step=t, micro_batch=m)) for r in range(2) for t in range(2) for m in range(2)}
    assert len(seeds) == 8


def test_torch_release_drops_local_label():
    assert str(torch_release("2.13.0+cpu")) == "2.13.0"


def test_tensor_parallel_mesh_and_data_parallel_ranks():
    s = Sharding(tp=2, tp_plan=lambda model, mesh: None)
    assert s.mesh_shape(4) == (2, 2) and s.mesh_dim_names(4) == ("dp", "tp") and s.data_parallel(4) == 2
    assert Sharding(replicate=2).mesh_dim_names(4) == ("replicate", "shard") and Sharding().data_parallel(4) == 4
    with pytest.raises(ValueError, match="not divisible by tp=2"):
        s.mesh_shape(3)
    with pytest.raises(ValueError, match="tensor parallel with HSDP"):
        Sharding(tp=2, replicate=2).mesh_shape(4)


def test_optimizer_kinds():
    from harness.spec import Optim

    params = [torch.nn.Parameter(torch.ones(2))]
    assert type(Optim().build(params)).__name__ == "AdamW"
    assert type(Optim(kind="sgd").build(params)).__name__ == "SGD"
    with pytest.raises(ValueError, match="Optim.kind: 'adam' is not 'adamw' or 'sgd'"):
        Optim(kind="adam")


def test_batches_move_as_dicts_and_only_floats_are_cast():
    import torch as t

    from harness.spec import move_batch

    batch = {"input_ids": t.ones(2, 3, dtype=t.long), "pixel_values": t.ones(2, 3)}
    moved = move_batch(batch, "cpu", t.bfloat16)
    assert moved["input_ids"].dtype == t.long and moved["pixel_values"].dtype == t.bfloat16


def test_an_expectation_with_several_statuses_names_a_text_for_each():
    with pytest.raises(ValueError, match=r"give a match per status, e.g. match=\{'error': ..., 'hang': ...\}"):
        Expect(status="error|hang", match="boom")
    with pytest.raises(ValueError, match="a status it does not expect"):
        Expect(status="error|hang", match={"error": "boom", "hang": "no result", "crash": "died"})
    assert Expect(status="error|hang", match={"error": "boom", "hang": "no result"}).match["hang"] == "no result"


def test_a_documented_mismatch_names_its_symptom():
    from harness.spec import grads_scaled

    with pytest.raises(ValueError, match=r"Expect\(mismatch\): name the symptom"):
        Expect(status="mismatch")
    Expect(status="mismatch", match="presence")
    Expect(status="mismatch", symptom=grads_scaled("world_size"))


def test_a_failure_without_its_text_or_symptom_is_not_as_documented():
    from tests.support import make_record

    per_status = {"error": "uniform gradient dtype", "hang": "no result"}
    ok = make_record(status="hang", expected="error|hang", expected_match=per_status, exc_msg="no result within 3 s")
    assert ok.outcome_matches()
    wrong = make_record(status="error", expected="error|hang", expected_match=per_status,
                        exc_msg="ImportError: No module named transformers")
    assert not wrong.outcome_matches()
    silent = make_record(status="mismatch", expected="mismatch", symptom_seen=False, symptom="also differs: w")
    assert not silent.outcome_matches()
    assert make_record(status="mismatch", expected="mismatch", symptom_seen=True, symptom="seen").outcome_matches()
