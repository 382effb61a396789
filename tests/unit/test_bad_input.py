"""Bad input through the real `kuberl` command: every kind is refused with exit status 2 and a line that
names the problem (its field path or flag where there is one), never a traceback, a hang or a crash.

Each command runs as a subprocess with a time limit and an address-space limit: an alias bomb or a 100 MB
file that was expanded or read whole would run into one of them and fail the test. The limits are the
documented ones (kuberl.api.load: MAX_JOB_BYTES, MAX_NODES, MAX_DEPTH)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from kuberl.api.load import MAX_DEPTH, MAX_JOB_BYTES, MAX_NODES
from kuberl.trainer.cli import SPEC_FLAGS

MALFORMED = REPO / "tests" / "data" / "malformed"
TIMEOUT_S = 120  # a refusal takes a couple of seconds (mostly Python starting); a hang is caught here
MEMORY_LIMIT = 1 << 30  # `kuberl validate` needs about 300 MiB; a bomb expanded would need tens of GiB


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def kuberl(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Exit status and stderr of `kuberl ARGS`, under the time and memory limits."""
    full_env = {name: value for name, value in os.environ.items() if name != "KUBERL_JOB_SPEC_FILE"}
    # One BLAS thread: on a many-core machine numpy's per-thread buffers alone would pass the memory limit.
    full_env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", *args], input=stdin or b"",
                          capture_output=True, timeout=TIMEOUT_S, env=full_env, preexec_fn=_limit_memory,
                          check=False)
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return proc.returncode, err


def refused(*args: str, **kwargs) -> str:
    code, err = kuberl(*args, **kwargs)
    assert code == 2, err
    return err


@pytest.fixture
def job_file(tmp_path, job_dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict, sort_keys=False))
    return path


# ---- what a file holds ---------------------------------------------------------------------------------------


def test_alias_bomb_is_refused_unexpanded():
    err = refused("validate", str(MALFORMED / "kwargs-alias-bomb.yaml"))
    assert f"spec.environment.kwargs.f[0] (line 22): the job holds more than {MAX_NODES} values once the alias " \
           "*e is expanded" in err


def test_random_bytes_are_not_utf8_text(tmp_path):
    path = tmp_path / "random.yaml"
    path.write_bytes(bytes([0x80, 0xdf, 0x00, 0xff]) * 1024)  # (what os.urandom gave the user, fixed)
    err = refused("validate", str(path))
    assert "<document> (line 1): not UTF-8 text: byte 0x80 at offset 0 cannot be decoded" in err
    assert "is this a binary file?" in err


def test_utf16_file_is_told_to_be_utf8(tmp_path, job_dict):
    path = tmp_path / "job.yaml"
    path.write_bytes(yaml.safe_dump(job_dict).encode("utf-16"))
    assert "save it as UTF-8" in refused("validate", str(path))


def test_a_100_mb_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(100 * 2**20)  # sparse: 100 MB that take no disk
    err = refused("validate", str(path))
    assert f"a job may be at most {MAX_JOB_BYTES} bytes (1 MiB) of text; this one is larger" in err


def test_a_directory_cannot_be_read(tmp_path):
    assert f"cannot read {tmp_path}: Is a directory" in refused("validate", str(tmp_path))


@pytest.mark.parametrize("levels", [40, 100_000])
def test_deep_nesting_is_refused_before_the_recursive_loader(tmp_path, job_dict, levels):
    text = yaml.safe_dump(job_dict, sort_keys=False).replace(
        "  environment:\n    id: CartPole-v1\n",
        "  environment:\n    id: CartPole-v1\n    kwargs: {x: " + "[" * levels + "]" * levels + "}\n")
    assert "kwargs: {x: [[[" in text
    line = text.splitlines().index(next(x for x in text.splitlines() if "kwargs: {x: [[[" in x)) + 1
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    err = refused("validate", str(path))
    if levels < 1000 or not yaml.__with_libyaml__:  # each level an event: refused at the first past the limit
        assert (f"spec.environment.kwargs.x[0][0]" in err and f"(line {line})" in err and f"mappings and lists "
                f"are nested {MAX_DEPTH + 1} levels deep here; a job may nest at most {MAX_DEPTH}" in err), err
    else:  # libyaml's scanner stops at 1000 levels before the first becomes an event: the same limit, told
        assert (f"(line {line}): mappings and lists are nested deeper than the YAML parser reads here (1000 "
                f"levels); a job may nest at most {MAX_DEPTH}" in err), err


def test_too_many_values_are_refused(tmp_path, job_dict):
    job_dict["spec"]["environment"]["kwargs"] = {"table": list(range(MAX_NODES))}
    path = tmp_path / "wide.yaml"
    path.write_text(json.dumps(job_dict))  # (JSON is YAML)
    assert path.stat().st_size < MAX_JOB_BYTES  # the number of values is what is too big, not the file
    err = refused("validate", str(path))
    assert "spec.environment.kwargs.table[" in err and f"a job may hold at most {MAX_NODES}" in err


def test_infinite_wall_clock_as_the_only_limit_is_refused(job_file):
    text = job_file.read_text()
    data = yaml.safe_load(text)
    data["spec"]["stopping"] = {"maxWallClockSeconds": float("inf")}
    job_file.write_text(yaml.safe_dump(data))
    err = refused("validate", str(job_file))
    assert "spec.stopping.maxWallClockSeconds (line" in err and "Input should be a finite number [given: inf]" in err


# ---- the command line's own values ---------------------------------------------------------------------------

# One bad value per flag that sets a spec field, and the job file's message for it.
BAD_FLAGS = {
    "--workers": ("1000", "Input should be less than or equal to 512 [given: 1000]"),
    "--metrics-port": ("6379", "port 6379 is the Ray GCS port"),
    "--max-env-steps": ("100000000000000000000",
                        "integers must be between -9223372036854775808 and 9223372036854775807"),
    "--seed": ("-1", "Input should be greater than or equal to 0 [given: -1]"),
    "--device": ("gpu", "Input should be 'auto', 'cpu' or 'cuda' [given: 'gpu']"),
}


def test_every_spec_flag_has_a_bad_value_here():
    assert set(BAD_FLAGS) == set(SPEC_FLAGS)


@pytest.mark.parametrize("flag", sorted(BAD_FLAGS))
def test_a_spec_flag_is_validated_as_the_field_it_sets(flag, job_file, tmp_path):
    value, message = BAD_FLAGS[flag]
    run_dir = tmp_path / "run"
    err = refused("train", str(job_file), flag, value, "--run-dir", str(run_dir))
    assert f"  - {flag} ({SPEC_FLAGS[flag][0]}): {message}" in err
    assert not run_dir.exists()  # nothing started


def test_the_learner_validates_its_flags_against_the_spec_from_the_operator(job_dict, tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_dict))
    err = refused("learner", "--workers", "1000", env={"KUBERL_JOB_SPEC_FILE": str(spec)})
    assert "--workers (spec.rolloutWorkers.replicas): Input should be less than or equal to 512" in err


def test_the_learner_refuses_a_spec_that_is_no_json(tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text('{"apiVersion": "kuberl.dev/v1alpha1", ')
    err = refused("learner", env={"KUBERL_JOB_SPEC_FILE": str(spec)})
    assert "<json> (line 1): JSON syntax error: Expecting property name enclosed in double quotes" in err


def test_stdin_is_held_to_the_same_limits(job_dict):
    assert "not UTF-8 text" in refused("train", "-", stdin=b"\xff\xfe\xfd")
    too_big = yaml.safe_dump(job_dict).encode() + b"#" * MAX_JOB_BYTES
    assert f"a job may be at most {MAX_JOB_BYTES} bytes" in refused("train", "-", stdin=too_big)


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port: Input should be less than or equal to 65535 [given: 70000]"),
    (["--max-batch", "0"], "--max-batch: Input should be greater than or equal to 1 [given: 0]"),
    (["--port", "9000", "--metrics-port", "9000"], "--metrics-port: must differ from --port [given: 9000]"),
], ids=["port", "max-batch", "same-ports"])
def test_serve_flags_are_checked_before_anything_loads(args, message, tmp_path):
    err = refused("serve", str(tmp_path / "no-such-policy"), *args)
    assert f"error: {message}" in err
    assert "no-such-policy" not in err  # refused before looking for the policy
