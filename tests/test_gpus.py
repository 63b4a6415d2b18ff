import pytest

from harness.process.gpus import gpu_slice, skip_reason, visible_gpus, worker_slot

EIGHT = [str(i) for i in range(8)]


def test_eight_gpus_four_workers_get_disjoint_pairs():
    slices = [gpu_slice(EIGHT, slot, 4, 2) for slot in range(4)]
    assert slices == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert len({g for s in slices for g in s}) == 8


def test_slice_never_exceeds_its_part_and_single_slot_takes_what_it_needs():
    assert gpu_slice(EIGHT, 1, 4, 4) == ["2", "3"]  # a 4-rank cell does not fit a 2-GPU part
    assert gpu_slice(EIGHT, 0, 1, 4) == ["0", "1", "2", "3"]
    assert gpu_slice([], 0, 2, 1) == []
    with pytest.raises(AssertionError):
        gpu_slice(EIGHT, 4, 4, 1)


@pytest.mark.parametrize(
    "env,expected",
    [({"PYTEST_XDIST_WORKER": "gw3", "PYTEST_XDIST_WORKER_COUNT": "4"}, (3, 4)),
     ({"FSDP_COMPAT_SLOT": "1/2"}, (1, 2)),
     ({}, (0, 1))],
)
def test_worker_slot(env, expected):
    assert worker_slot(env) == expected


def test_visible_gpus_reads_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_skip_reasons():
    assert skip_reason("cpu", 4, []) is None
    assert skip_reason("cuda", 2, ["0", "1"]) is None
    assert skip_reason("cuda", 4, ["0", "1"]) == "needs 4 GPUs, 2 available to this worker"


def test_backend_per_device_from_scenarios():
    from harness.scenario.load import load_scenarios

    s = load_scenarios().scenarios
    assert s["plain"].backend_for("cpu") == "gloo" and s["plain"].backend_for("cuda") == "nccl"
    assert s["f_offload_clip_nccl_only"].backend_for("cuda") == "nccl"
    assert s["f_offload_clip_mixed_backend"].backend_for("cuda") == "cpu:gloo,cuda:nccl"
    assert s["f_offload_clip_nccl_only"].groups.norm_backend == {"cpu": "cuda:gloo"}


def test_gpu_smoke_cells_exist_at_world_size_1_on_cuda():
    import importlib.util

    from harness.scenario.load import load_scenarios
    from tests.support import ROOT

    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    scenarios = load_scenarios().scenarios
    for name in noxfile.GPU_SMOKE:
        assert 1 in scenarios[name].world_sizes and "cuda" in scenarios[name].devices, name
    # the wrong-device scaling error is the documented vanilla outcome on cuda
    g = scenarios["g_offload_grad_scaling"]
    assert g.expected(variant="vanilla", torch_version="2.13.0", device="cuda", world_size=1).status == ("error",)
