"""memfit.configure_device: the settings from arguments or the environment, the CPU no-op,
and the GPU path against a stand-in for TensorFlow (the real GPU path runs only on a GPU)."""

import subprocess
import sys
import types

import pytest

import memfit
from memfit import device as device_module
from memfit.device import (
    DeviceConfigError,
    configure_device,
    device_env,
    device_settings,
)
from memfit.env import GPU_MEMORY_GROWTH_ENV, GPU_MEMORY_LIMIT_ENV

MIB = 2**20


def test_settings_from_the_environment():
    assert device_settings(environ={}) == (None, None, "none")
    assert device_settings(environ={GPU_MEMORY_LIMIT_ENV: "1GiB"}) == (2**30, None, "environment")
    assert device_settings(environ={GPU_MEMORY_LIMIT_ENV: "1073741824"})[0] == 2**30
    assert device_settings(environ={GPU_MEMORY_GROWTH_ENV: "true"}) == (None, True, "environment")
    assert device_settings(environ={GPU_MEMORY_GROWTH_ENV: "0"}) == (None, False, "environment")
    # what memfit share hands down is read back unchanged
    assert device_settings(environ=device_env(memory_limit=3 * 2**30))[0] == 3 * 2**30
    assert device_settings(environ=device_env(growth=True))[1] is True


def test_arguments_win_over_the_environment():
    env = {GPU_MEMORY_LIMIT_ENV: "1GiB"}
    assert device_settings("512MiB", environ=env) == (512 * MIB, None, "arguments")
    assert device_settings(growth=True, environ=env) == (None, True, "arguments")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory_limit": "lots"}, "memory_limit is not a size. .*Received: memory_limit='lots'"),
    ({"memory_limit": "100KiB"}, "at least 1 MiB.*Received: memory_limit='100KiB'"),
    ({"memory_limit": "1GiB", "growth": True}, "either a memory cap or memory growth"),
    ({"growth": "maybe"}, "growth must be true or false.*Received: growth='maybe'"),
    ({"growth": 3}, "growth must be True or False. Received: growth=3"),
    ({"environ": {GPU_MEMORY_LIMIT_ENV: "2 gigs"}},
     f"{GPU_MEMORY_LIMIT_ENV} is not a size.*Received: {GPU_MEMORY_LIMIT_ENV}='2 gigs'"),
    ({"environ": {GPU_MEMORY_GROWTH_ENV: "sometimes"}},
     f"Received: {GPU_MEMORY_GROWTH_ENV}='sometimes'"),
    ({"environ": {GPU_MEMORY_LIMIT_ENV: "1GiB", GPU_MEMORY_GROWTH_ENV: "1"}}, "not both"),
])
def test_bad_settings_are_clear_errors(kwargs, message):
    environ = kwargs.pop("environ", {})
    with pytest.raises(DeviceConfigError, match=message):
        device_settings(**kwargs, environ=environ)


def test_nothing_to_do_imports_no_tensorflow(monkeypatch):
    monkeypatch.delenv(GPU_MEMORY_LIMIT_ENV, raising=False)
    monkeypatch.delenv(GPU_MEMORY_GROWTH_ENV, raising=False)
    monkeypatch.setattr(device_module, "_tensorflow", lambda: pytest.fail("imported TF"))
    config = configure_device()
    assert not config.applied and config.source == "none"
    assert "nothing to configure" in config.message


class FakeTF:
    """Just enough of tf.config for configure_device, with a switch for 'too late'."""

    def __init__(self, gpus=("/physical_device:GPU:0",), initialised=False):
        self.gpus = [types.SimpleNamespace(name=n) for n in gpus]
        self.initialised = initialised
        self.limits: dict[str, int] = {}
        self.growth: dict[str, bool] = {}
        fake = self

        class Experimental:
            @staticmethod
            def set_memory_growth(gpu, value):
                if fake.initialised:
                    raise RuntimeError("Physical devices cannot be modified after being "
                                       "initialized")
                fake.growth[gpu.name] = value

            @staticmethod
            def get_memory_growth(gpu):
                return fake.growth.get(gpu.name, False)

        class Config:
            experimental = Experimental

            @staticmethod
            def list_physical_devices(kind):
                assert kind == "GPU"
                return list(fake.gpus)

            @staticmethod
            def LogicalDeviceConfiguration(memory_limit):          # noqa: N802
                return types.SimpleNamespace(memory_limit=memory_limit)

            @staticmethod
            def set_logical_device_configuration(gpu, configs):
                if fake.initialised:
                    raise RuntimeError("Virtual devices cannot be modified after being "
                                       "initialized")
                fake.limits[gpu.name] = configs[0].memory_limit

            @staticmethod
            def get_logical_device_configuration(gpu):
                limit = fake.limits.get(gpu.name)
                return None if limit is None else \
                    [types.SimpleNamespace(memory_limit=limit)]

        self.config = Config


@pytest.fixture
def fake_tf(monkeypatch):
    tf = FakeTF(gpus=("/physical_device:GPU:0", "/physical_device:GPU:1"))
    monkeypatch.setattr(device_module, "_tensorflow", lambda: tf)
    monkeypatch.delenv(GPU_MEMORY_LIMIT_ENV, raising=False)
    monkeypatch.delenv(GPU_MEMORY_GROWTH_ENV, raising=False)
    return tf


def test_the_gpu_cap_is_set_in_whole_mib_on_every_gpu(fake_tf):
    config = configure_device(memory_limit="1.5GiB")
    assert fake_tf.limits == {"/physical_device:GPU:0": 1536, "/physical_device:GPU:1": 1536}
    assert config.applied and config.memory_limit == 1536 * MIB and len(config.gpus) == 2
    assert "a cap of 1.5 GiB" in config.message
    # the same call again once TensorFlow started is fine; another one is not
    fake_tf.initialised = True
    assert configure_device(memory_limit="1.5GiB").applied
    with pytest.raises(DeviceConfigError, match="configure_device came too late.*a cap of "
                                                "2.0 GiB.*at the top of the script"):
        configure_device(memory_limit="2GiB")


def test_the_cap_from_memfit_share_and_growth(fake_tf, monkeypatch):
    monkeypatch.setenv(GPU_MEMORY_LIMIT_ENV, str(2**30))
    config = configure_device()
    assert config.source == "environment" and fake_tf.limits["/physical_device:GPU:0"] == 1024
    monkeypatch.delenv(GPU_MEMORY_LIMIT_ENV)
    fresh = FakeTF()
    monkeypatch.setattr(device_module, "_tensorflow", lambda: fresh)
    assert configure_device(growth=True).growth is True
    assert fresh.growth == {"/physical_device:GPU:0": True}


def test_too_late_is_explained(monkeypatch):
    tf = FakeTF(initialised=True)
    monkeypatch.setattr(device_module, "_tensorflow", lambda: tf)
    with pytest.raises(DeviceConfigError) as info:
        configure_device(memory_limit="1GiB")
    text = str(info.value)
    assert "too late" in text and "already initialised /physical_device:GPU:0" in text
    assert "Virtual devices cannot be modified" in text      # what TensorFlow said


def test_on_the_cpu_it_is_a_no_op_that_says_so(monkeypatch, caplog):
    monkeypatch.setattr(device_module, "_tensorflow", lambda: FakeTF(gpus=()))
    with caplog.at_level("INFO", logger="memfit.share"):
        config = memfit.configure_device(memory_limit="1GiB")
    assert not config.applied and config.gpus == ()
    assert "no GPU is visible to TensorFlow" in config.message
    assert "no GPU is visible" in caplog.text


def _gpu_visible() -> bool:
    from memfit.share.planner import gpu_memory

    return gpu_memory(0) is not None


def test_with_real_tensorflow_in_a_child():
    """The real thing, in a fresh process: a no-op on the CPU; on a GPU, the cap is set
    and a call after the first op is the clear error."""
    code = """
import json, memfit, tensorflow as tf
out = {}
c = memfit.configure_device(memory_limit="1GiB")
out["applied"], out["message"] = c.applied, c.message
if c.applied:
    gpu = tf.config.list_physical_devices("GPU")[0]
    out["limit"] = tf.config.get_logical_device_configuration(gpu)[0].memory_limit
    tf.constant(1.0) + 1.0
    try:
        memfit.configure_device(memory_limit="2GiB")
    except memfit.share.DeviceConfigError as e:
        out["late"] = str(e)
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not _gpu_visible():
        assert out["applied"] is False and "no GPU is visible" in out["message"]
    else:                                                   # pragma: no cover - GPU only
        assert out["applied"] and out["limit"] == 1024 and "too late" in out["late"]


def test_a_gpu_job_gets_its_cap_in_the_form_jax_obeys(monkeypatch, tmp_path):
    """memfit share hands a GPU job its cap for TensorFlow (configure_device) and for JAX:
    no preallocation (JAX's default takes 75 % of the card at start, so a second JAX
    training on the card fails) and the need as a fraction of the card's total memory; a
    job run alone to learn its need gets no fraction; the jobs file's env wins. A real
    JAX training under these caps is benchmarks/gpu_check.py's, on a lent GPU."""
    from memfit.device import XLA_MEM_FRACTION_ENV, XLA_PREALLOCATE_ENV
    from memfit.share import launch
    from memfit.share.layout import JobFiles
    from memfit.share.planner import PlannedJob

    monkeypatch.setattr(launch, "gpu_memory", lambda index: (80 * 2**30, 70 * 2**30)
                        if index == 1 else None)

    def job(need, **env):
        return PlannedJob(name="a", command=("python", "t.py"), need=need,
                          need_source="given", note="", charge=(need or 0) + 2**28,
                          exclusive=need is None, restart=False, env=env, index=1)

    files = JobFiles.of(tmp_path, "a")
    env = launch.job_environment(job(20 * 2**30), "gpu:1", files)
    assert env[XLA_PREALLOCATE_ENV] == "false" and env[XLA_MEM_FRACTION_ENV] == "0.2500"
    assert env[GPU_MEMORY_LIMIT_ENV] == str(20 * 2**30)
    alone = launch.job_environment(job(None), "gpu:1", files)
    assert alone[XLA_PREALLOCATE_ENV] == "false" and XLA_MEM_FRACTION_ENV not in alone
    unknown_card = launch.job_environment(job(2**30), "gpu:0", files)
    assert XLA_MEM_FRACTION_ENV not in unknown_card
    mine = launch.job_environment(job(2**30, XLA_PYTHON_CLIENT_MEM_FRACTION="0.5"), "gpu:1",
                                  files)
    assert mine[XLA_MEM_FRACTION_ENV] == "0.5"
    cpu = launch.job_environment(job(2**30), "cpu", files)
    assert XLA_PREALLOCATE_ENV not in cpu and XLA_MEM_FRACTION_ENV not in cpu


# -- Keras's other backends: the cap in the form JAX or PyTorch obeys --------------------

def test_on_jax_the_share_s_fraction_is_kept_and_preallocation_turned_off(monkeypatch):
    import memfit.device as device

    monkeypatch.setattr(device, "keras_backend", lambda: "jax")
    monkeypatch.setattr(device, "_jax_may_use_a_gpu", lambda: True)      # a GPU machine
    monkeypatch.setattr(device, "_jax_started", lambda: False)
    monkeypatch.setenv("MEMFIT_GPU_MEMORY_LIMIT", "4GiB")
    monkeypatch.setenv(device.XLA_MEM_FRACTION_ENV, "0.0285")
    monkeypatch.delenv(device.XLA_PREALLOCATE_ENV, raising=False)
    config = configure_device()
    assert config.applied and config.memory_limit == 4 * 2**30
    import os

    assert os.environ[device.XLA_PREALLOCATE_ENV] == "false"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.0285" in config.message


def test_on_jax_a_cap_without_the_share_of_the_card_is_one_clear_error(monkeypatch):
    import memfit.device as device

    monkeypatch.setattr(device, "keras_backend", lambda: "jax")
    monkeypatch.setattr(device, "_jax_may_use_a_gpu", lambda: True)      # a GPU machine
    monkeypatch.delenv(device.XLA_MEM_FRACTION_ENV, raising=False)
    with pytest.raises(DeviceConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION.*Received: "
                                                "memory_limit=2147483648"):
        configure_device(memory_limit="2GiB")


def test_on_jax_after_it_started_a_change_is_too_late(monkeypatch):
    import memfit.device as device

    monkeypatch.setattr(device, "keras_backend", lambda: "jax")
    monkeypatch.setattr(device, "_jax_may_use_a_gpu", lambda: True)      # a GPU machine
    monkeypatch.setattr(device, "_jax_started", lambda: True)
    monkeypatch.delenv(device.XLA_PREALLOCATE_ENV, raising=False)
    with pytest.raises(DeviceConfigError, match="too late"):
        configure_device(growth=True)
    monkeypatch.setenv(device.XLA_PREALLOCATE_ENV, "false")     # already so: fine
    assert not configure_device(growth=True).applied


def test_on_jax_without_a_gpu_a_cap_or_growth_does_nothing_and_says_so(monkeypatch):
    """A stranger's cap on a CPU machine raised about XLA_PYTHON_CLIENT_MEM_FRACTION, and
    growth=True said "memory growth on": TensorFlow says there is nothing to do."""
    import memfit.device as device

    monkeypatch.setattr(device, "keras_backend", lambda: "jax")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv(device.XLA_MEM_FRACTION_ENV, raising=False)
    monkeypatch.delenv(device.XLA_PREALLOCATE_ENV, raising=False)
    for config in (configure_device(memory_limit="1GiB"), configure_device(growth=True)):
        assert not config.applied and config.gpus == ()
        assert "JAX here has no GPU to run on" in config.message
        assert "does nothing on the CPU" in config.message
    import os

    assert device.XLA_PREALLOCATE_ENV not in os.environ           # nothing set


def test_on_pytorch_the_cap_is_its_per_process_fraction(monkeypatch):
    import memfit.device as device

    calls = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 2,
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=16 * 2**30),
        set_per_process_memory_fraction=lambda f, i: calls.append((f, i)))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(device, "keras_backend", lambda: "torch")
    config = configure_device(memory_limit="4GiB")
    assert calls == [(0.25, 0), (0.25, 1)]
    assert config.applied and config.gpus == ("cuda:0", "cuda:1")
