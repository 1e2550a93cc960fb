"""Which job holds each device, as the kubelet assigned it, against the ledger's placements (pure join)."""

from chamber.collector.core.assignments import ChamberPod, DeviceAssignment, attribute

NODE = "gpu-3"
DEVICES = [f"GPU-{i}" for i in range(8)]


def pod(name: str, job: str, *, gpus: int = 4, placement: tuple[str, ...] = (NODE,), running: bool = True,
        attempt: int = 1) -> ChamberPod:  # fmt: skip
    return ChamberPod("ml", name, job, attempt, gpus, placement, running)


def given(name: str, *devices: str, namespace: str = "ml", resource: str = "nvidia.com/gpu") -> DeviceAssignment:
    return DeviceAssignment(namespace, name, "main", resource, tuple(devices))


def test_devices_are_attributed_to_the_job_whose_pod_holds_them_and_agreeing_counts_are_quiet() -> None:
    pods = [pod("llm-0", "k8s-a", placement=(NODE, "gpu-4")), pod("mnist-0", "k8s-b", gpus=2)]
    listed = [
        given("llm-0", "GPU-0", "GPU-1", "GPU-2", "GPU-3"), given("mnist-0", "GPU-5", "GPU-6"),
        given("notebook", "GPU-7", namespace="lab"), given("llm-0", "0000:3b:00.0", resource="example.com/nic"),
    ]  # fmt: skip
    got = attribute(listed, pods, node=NODE, devices=DEVICES)
    assert got.job_of == {"GPU-0": "k8s-a", "GPU-1": "k8s-a", "GPU-2": "k8s-a", "GPU-3": "k8s-a",
                          "GPU-5": "k8s-b", "GPU-6": "k8s-b"}  # fmt: skip
    assert got.pod_of["GPU-7"] == "lab/notebook", "a pod that is not Chamber's is named, and holds no job"
    assert "GPU-7" not in got.job_of
    assert got.mismatches == ()


def test_a_count_other_than_the_ledgers_a_foreign_device_and_a_shared_device_are_mismatches() -> None:
    pods = [pod("llm-0", "k8s-a", placement=(NODE, NODE)), pod("llm-1", "k8s-a", placement=(NODE, NODE)),
            pod("stray-0", "k8s-c", placement=("gpu-9",))]  # fmt: skip
    listed = [given("llm-0", "GPU-0", "GPU-1", "GPU-2", "GPU-3"), given("llm-1", "GPU-4", "GPU-5", "GPU-6"),
              given("stray-0", "GPU-7", "MIG-unknown"), given("other", "GPU-7", namespace="lab")]  # fmt: skip
    got = attribute(listed, pods, node=NODE, devices=DEVICES)
    assert set(got.mismatches) == {
        "device MIG-unknown of pod ml/stray-0 (job k8s-c) is not a GPU of gpu-3",
        "device GPU-7 is assigned to 2 containers: lab/other/main, ml/stray-0/main",
        "job k8s-a: the ledger booked 8 GPU(s) on gpu-3, the kubelet gave its pods here 7",
        "job k8s-c: the ledger booked 0 GPU(s) on gpu-3, the kubelet gave its pods here 2",
    }


def test_pods_still_starting_may_have_fewer_devices_but_never_more() -> None:
    starting = [pod("llm-0", "k8s-a", running=False)]
    assert attribute([], starting, node=NODE, devices=DEVICES).mismatches == (), "not created yet: no devices"
    too_many = attribute([given("llm-0", *DEVICES[:6])], starting, node=NODE, devices=DEVICES)
    assert too_many.mismatches == ("job k8s-a: the ledger booked 4 GPU(s) on gpu-3, the kubelet gave its pods here 6",)


def test_the_newest_attempts_placement_is_the_ledgers() -> None:
    pods = [pod("old-0", "k8s-a", placement=("gpu-9",), attempt=1, running=False),
            pod("new-0", "k8s-a", placement=(NODE,), attempt=2)]  # fmt: skip
    got = attribute([given("new-0", *DEVICES[:4])], pods, node=NODE, devices=DEVICES)
    assert got.mismatches == ()
