"""Library loading: handlers registered when built, readable reasons (never a crash) when not."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import jaxcnn
from jaxcnn._native import library

NVCC = shutil.which("nvcc")
CUDA_BUILD_EXPECTED = NVCC is not None and os.environ.get("JAXCNN_CUDA", "AUTO").upper() != "OFF"


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        env={**os.environ, **env}, timeout=300,
    )


@pytest.mark.skipif(not CUDA_BUILD_EXPECTED, reason="no nvcc here: the CUDA library is not built")
def test_cuda_sources_compiled_into_library():
    """Where nvcc exists the install built cuda_ops/ and the loader registered every handler."""
    state = library.library_state()
    assert state.path and os.path.exists(state.path), state.reason
    assert state.registered, state.reason
    assert "cuda_archs=" in state.build_info and "jaxlib=" in state.build_info
    assert state.ffi_api_version is not None


def test_abi_check_rejects_newer_library():
    assert library.check_abi((0, 3), (0, 3)) == ""
    assert library.check_abi((0, 2), (0, 3)) == ""
    assert "ABI mismatch" in library.check_abi((0, 4), (0, 3))
    assert "ABI mismatch" in library.check_abi((1, 0), (0, 9))


def test_runtime_ffi_version_is_read_from_jaxlib_headers():
    version = library.runtime_ffi_api_version()
    assert version is not None and version[0] >= 0 and version[1] >= 1


def test_without_gpu_reason_is_readable_and_require_raises():
    if jaxcnn.cuda_available():
        pytest.skip("a GPU is present")
    reason = jaxcnn.cuda_unavailable_reason()
    assert reason
    with pytest.raises(RuntimeError, match="jaxcnn CUDA kernels unavailable"):
        jaxcnn.require_cuda()


def test_bogus_library_fails_loudly_without_crashing(tmp_path):
    bogus = tmp_path / "libjaxcnn_cuda.so"
    bogus.write_text("not an ELF file")
    proc = run_python(
        """
        import jaxcnn
        print("REASON:", jaxcnn.cuda_unavailable_reason())
        try:
            jaxcnn.require_cuda()
        except RuntimeError as e:
            print("RAISED:", e)
        """,
        JAXCNN_LIBRARY=str(bogus),
    )
    assert proc.returncode == 0, proc.stderr
    assert "REASON: cannot load" in proc.stdout
    assert "RAISED: jaxcnn CUDA kernels unavailable: cannot load" in proc.stdout


def test_missing_library_reason(tmp_path):
    proc = run_python(
        "import jaxcnn; print(jaxcnn.cuda_unavailable_reason())",
        JAXCNN_LIBRARY=str(tmp_path / "absent.so"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA library built" in proc.stdout


@pytest.mark.skipif(not CUDA_BUILD_EXPECTED, reason="no nvcc here: the CUDA library is not built")
def test_abi_mismatch_is_reported_not_registered(monkeypatch):
    """A library built for a newer FFI API than the runtime's is refused with the reason."""
    monkeypatch.setattr(library, "runtime_ffi_api_version", lambda: (0, 0))
    state = library._load(__import__("pathlib").Path(library.library_state().path))
    assert not state.registered
    assert "ABI mismatch" in state.reason and "--no-build-isolation" in state.reason


@pytest.mark.skipif(not CUDA_BUILD_EXPECTED, reason="no nvcc here: the CUDA library is not built")
@pytest.mark.parametrize("env, expected", [(None, "COMMAND_BUFFER_COMPATIBLE"), ("0", "DEFAULT")])
def test_handlers_registered_command_buffer_compatible(monkeypatch, env, expected):
    """jaxlib takes the command-buffer trait from the registration call (the handler's own
    metadata is not consulted): without it XLA never puts our kernels in its CUDA graphs."""
    if env is None:
        monkeypatch.delenv(library.COMMAND_BUFFERS_ENV, raising=False)
    else:
        monkeypatch.setenv(library.COMMAND_BUFFERS_ENV, env)
    calls = []
    monkeypatch.setattr(library.jax.ffi, "register_ffi_target",
                        lambda name, fn, platform, **kw: calls.append((name, platform, kw)))
    state = library._load(__import__("pathlib").Path(library.library_state().path))
    assert state.registered, state.reason
    assert {name for name, _, _ in calls} == set(library.FFI_TARGETS) - set(state.missing_targets)
    want = getattr(library.xla_client.CustomCallTargetTraits, expected)
    assert all(p == "CUDA" and kw == {"traits": want} for _, p, kw in calls), calls
