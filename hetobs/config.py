"""Every HETOBS_* setting, read from the environment through one table.

The table is hetobs/settings_table.py (names, kinds, defaults, bounds, choices, docs); the
native core's table is generated from it and the README's is rendered from it. Every read
goes through `setting()` here, so a typo fails at start-up with the variable's name and value,
not deep inside the transport, and reads the same as the native parser (which the
interposers use) reads it.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, MutableMapping

from .settings_table import SETTINGS, Spec

__all__ = ["Settings", "SETTINGS", "Spec", "SettingError", "setting", "spec", "job_root", "from_env", "check_timeout",
           "Launch", "launch_from_env", "export_launch_env", "expand_hostlist"]


class SettingError(ValueError):
    """A HETOBS_* (or rendezvous) variable holds a value that cannot be used."""


_BY_NAME: dict[str, Spec] = {s.name: s for s in SETTINGS}


def spec(name: str) -> Spec:
    """The table's row of `name` (KeyError for a name the table lacks: a bug, not the user's)."""
    return _BY_NAME[name]


def setting(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting from `env` (default os.environ), read as its row in the table says.

    float -> float, int -> int, choice -> the choice (lower case), flag -> bool, signal -> its
    number (0: off), text -> the value as given. Unset, the table's default is read. Raises
    SettingError naming the variable and the value.
    """
    row = spec(name)
    env = os.environ if env is None else env
    raw = env.get(name, row.default)
    return _READERS[row.kind](row, raw)


def _number(row: Spec, raw: str) -> float | int:
    integer = row.kind == "int"
    try:
        value: float | int = int(raw) if integer else float(raw)
    except ValueError:
        raise SettingError(f"{row.name}={raw!r}: expected a number") from None
    if isinstance(value, float) and math.isnan(value):
        raise SettingError(f"{row.name}={raw!r}: expected a number, not NaN")
    assert row.minimum is not None, row.name
    minimum = int(row.minimum) if integer else float(row.minimum)
    if value < minimum:
        raise SettingError(f"{row.name}={raw!r}: must be at least {minimum}")
    if row.maximum is not None and value > row.maximum:
        raise SettingError(f"{row.name}={raw!r}: must be at most {row.maximum}")
    return value


def _choice(row: Spec, raw: str) -> str:
    value = raw.strip().lower()
    if value not in row.choices:
        raise SettingError(f"{row.name}={raw!r}: expected one of {', '.join(row.choices)}")
    return value


def _flag(row: Spec, raw: str) -> bool:
    return _choice(row, raw) in ("1", "true")


def _signal(row: Spec, raw: str) -> int:
    import signal

    raw = raw.strip()
    if raw.lower() in ("", "off", "0", "none"):
        return 0
    if raw.isdigit():
        num = int(raw)
    else:
        upper = raw.upper()
        sig = getattr(signal, upper if upper.startswith("SIG") else "SIG" + upper, None)
        if not isinstance(sig, signal.Signals):
            raise SettingError(f"{row.name}={raw!r}: not a signal name or number")
        num = int(sig)
    if num in (int(signal.SIGKILL), int(signal.SIGSTOP)) or not 0 < num < signal.NSIG:
        raise SettingError(f"{row.name}={raw!r}: cannot be caught")
    return num


def _text(row: Spec, raw: str) -> str:
    return raw


_READERS = {"float": _number, "int": _number, "choice": _choice, "flag": _flag, "signal": _signal, "text": _text}


@dataclass(frozen=True)
class Settings:
    """The settings a rank starts with (from_env). No defaults here: they are the table's."""

    job_id: str
    job_id_generated: bool
    job_id_from: str  # the variable job_id came from (_job_id), "generated" when made here
    dir: str
    transport: str
    secret: str
    timeout: float
    connect_timeout: float
    connect_retries: int  # read by the native core itself too (common/env_config.cc netSettings)
    reconnect_timeout: float
    records: int
    hang_timeout: float
    watchdog: bool
    abort_on_hang: bool
    dump_signal: int
    small_bytes: int
    bw_log: str
    bw_log_interval: float
    bw_log_file: str
    debug: str
    otel_sample: float
    torch_native: bool
    relay_chunk_bytes: int
    relay_slots: int


def check_timeout(value: float | None, what: str = "timeout") -> float:
    """A timeout argument as the native core takes it: seconds >= 0, inf = never, None = -1 (the default).

    Raises ValueError naming `what` for NaN or a negative number.
    """
    if value is None:
        return -1.0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r}: expected seconds (a number, inf for no limit)") from None
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{what}={value!r}: expected seconds >= 0 (inf for no limit), not {seconds}")
    return seconds


# Launchers' placeholders, not ids: torchrun's static rendezvous sets TORCHELASTIC_RUN_ID=none
# for every job, so two jobs on one machine would share one job directory.
_PLACEHOLDER_IDS = ("none",)


def slurm_step(env: Mapping[str, str]) -> str | None:
    """The srun step this process is a task of (SLURM_STEP_ID, or the older SLURM_STEPID), else None.

    A batch script or an salloc shell has a job id but no step: it is not one of the job's tasks.
    """
    for name in ("SLURM_STEP_ID", "SLURM_STEPID"):
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def _job_id(env: Mapping[str, str]) -> tuple[str, str]:
    """(id, where from: a variable's name, "SLURM_JOB_ID.SLURM_STEP_ID" or "generated").

    A generated id is this rank's own until rank 0's is adopted at rendezvous. Kept equal to
    csrc/src/common/env_config.cc readEnvSettings (the interposers read it there).
    """
    for name in ("HETOBS_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = (setting(name, env) if name == "HETOBS_JOB_ID" else env.get(name, "")).strip()
        if name == "TORCHELASTIC_RUN_ID" and value.lower() in _PLACEHOLDER_IDS:
            continue
        if not value:
            continue
        source = name
        step = slurm_step(env) if name == "SLURM_JOB_ID" else None
        if step is not None:
            # One id per step: two sruns of one allocation (or a job's retries) keep their dumps apart.
            value, source = f"{value}.{step}", "SLURM_JOB_ID.SLURM_STEP_ID"
        if "/" in value or value in (".", "..") or len(value) > 128:
            raise SettingError(f"{name}={value!r}: a job id must be a plain name (no '/', at most 128 chars)")
        return value, source
    return uuid.uuid4().hex[:12], "generated"


@dataclass(frozen=True)
class Launch:
    """Where this process sits in its job, as its launcher said (None: not said).

    `source`: "env" (RANK/WORLD_SIZE, as torchrun or a user sets them), "slurm" (a task of an
    srun step), "openmpi" or "pmi" (mpirun of Open MPI, MPICH/Hydra), or "" (no launcher).
    """

    source: str
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None


# (source, rank, world size, local rank, node rank) variables of each launcher, in the order
# they are tried (the NCCL interposer's worldFromEnv, csrc/interpose/nccl/nccl_state.cc, tries
# the same): an explicit RANK wins (torchrun run under srun sets it for its workers).
_LAUNCHERS = (
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_NODE_RANK"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", None),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"),
)
# Derived rendezvous ports stay below Linux's ephemeral range (32768-60999), where outgoing
# connections take theirs.
_SLURM_PORT_BASE, _SLURM_PORT_SPAN = 20000, 12000


def _int_var(env: Mapping[str, str], name: str | None) -> int | None:
    if name is None:
        return None
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected an integer") from None
    if value < 0:
        raise SettingError(f"{name}={raw!r}: expected an integer >= 0")
    return value


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch:
    """This process's place in the job from its launcher's variables (SettingError naming a bad one).

    srun's variables count only inside a step (SLURM_STEP_ID set): a batch script sees
    SLURM_PROCID=0 and SLURM_NTASKS=N too, but it is no rank of the N. Under srun,
    MASTER_ADDR defaults to the first host of the step's node list (rank 0 runs there) and
    MASTER_PORT to a port derived from the job and step ids, the same on every task.
    """
    env = os.environ if env is None else env
    for source, rank_var, size_var, local_var, node_var in _LAUNCHERS:
        if not env.get(rank_var, "").strip() and not env.get(size_var, "").strip():
            continue
        if source == "slurm" and slurm_step(env) is None:
            continue
        rank, size = _int_var(env, rank_var), _int_var(env, size_var)
        if source == "slurm" and size is None:
            size = _int_var(env, "SLURM_STEP_NUM_TASKS")
        master_addr = env.get("MASTER_ADDR", "").strip() or None
        master_port = _int_var(env, "MASTER_PORT")
        if source == "slurm":
            master_addr = master_addr or _first_slurm_host(env)
            if master_port is None:
                step_id = f"{env.get('SLURM_JOB_ID', '').strip()}.{slurm_step(env)}"
                master_port = _SLURM_PORT_BASE + zlib.crc32(step_id.encode()) % _SLURM_PORT_SPAN
        return Launch(source, rank, size, _int_var(env, local_var), _int_var(env, node_var), master_addr,
                      master_port)
    return Launch("", master_addr=env.get("MASTER_ADDR", "").strip() or None,
                  master_port=_int_var(env, "MASTER_PORT"))


def _first_slurm_host(env: Mapping[str, str]) -> str | None:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        raw = env.get(name, "").strip()
        if raw:
            try:
                return next(expand_hostlist(raw))
            except (ValueError, StopIteration) as e:
                raise SettingError(f"{name}={raw!r}: not a Slurm host list ({e or 'empty'})") from None
    return None


def export_launch_env(env: MutableMapping[str, str] | None = None) -> Launch:
    """Set torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that a
    launcher other than torchrun implies and nobody set, so torch's env:// rendezvous works
    under srun or mpirun unchanged. Variables already set are kept. Returns the launch read."""
    env = os.environ if env is None else env
    launch = launch_from_env(env)
    if launch.source in ("", "env"):
        return launch
    for name, value in (("RANK", launch.rank), ("WORLD_SIZE", launch.world_size), ("LOCAL_RANK", launch.local_rank),
                        ("MASTER_ADDR", launch.master_addr), ("MASTER_PORT", launch.master_port)):
        if value is not None and not env.get(name, "").strip():
            env[name] = str(value)
    return launch


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_hostlist(text: str) -> Iterator[str]:
    """The host names of a Slurm host list, in order ("node[01-03,07],gpu1" -> node01, node02,
    node03, node07, gpu1). Brackets hold comma lists of numbers and ranges, zero padding kept;
    several bracket groups in one name multiply ("r[1-2]n[1-2]"). ValueError if malformed: the
    list's brackets are checked at once, its names made as they are taken (a list of a whole
    cluster need not be expanded for its first host)."""
    for item in _split_top(text):
        yield from _expand_item(item)


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_item(item: str) -> Iterator[str]:
    open_at = item.find("[")
    if open_at < 0:
        if not item.strip() or any(c.isspace() for c in item):
            raise ValueError(f"bad host name {item!r}")
        yield item
        return
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"bad range {part!r} in {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"range {part!r} runs backwards")
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            for tail in _expand_item(rest) if rest else ("",):
                yield f"{prefix}{n:0{width}d}{tail}"


def job_root(env: Mapping[str, str] | None = None) -> str:
    """HETOBS_DIR, else <tmp>/hetobs-<uid> (the native core's default is the same: env_config.cc)."""
    return setting("HETOBS_DIR", env) or os.path.join(tempfile.gettempdir(), f"hetobs-{os.getuid()}")


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting a rank starts with (raises SettingError naming the variable)."""
    env = os.environ if env is None else env
    job_id, job_id_from = _job_id(env)
    setting("HETOBS_SHM_SINGLE_COPY_BYTES", env)  # read by the native core (env_config.cc); refused here first
    for name in ("HETOBS_SUSPECT_FACTOR", "HETOBS_SUSPECT_FLOOR", "HETOBS_SUSPECT_HISTORY"):
        setting(name, env)  # read by the native watchdog (env_config.cc suspectSettings); refused here first
    for name in ("HETOBS_DIGEST", "HETOBS_DIGEST_RATE", "HETOBS_DIGEST_ACTION"):  # likewise (digestSettings)
        setting(name, env)
    return Settings(
        job_id=job_id,
        job_id_generated=job_id_from == "generated",
        job_id_from=job_id_from,
        dir=job_root(env),
        transport=setting("HETOBS_TRANSPORT", env),
        secret=setting("HETOBS_SECRET", env),
        timeout=float(setting("HETOBS_TIMEOUT", env)),
        connect_timeout=float(setting("HETOBS_CONNECT_TIMEOUT", env)),
        connect_retries=setting("HETOBS_CONNECT_RETRIES", env),
        reconnect_timeout=float(setting("HETOBS_RECONNECT_TIMEOUT", env)),
        records=setting("HETOBS_RECORDS", env),
        hang_timeout=float(setting("HETOBS_HANG_TIMEOUT", env)),
        watchdog=setting("HETOBS_WATCHDOG", env),
        abort_on_hang=setting("HETOBS_ABORT_ON_HANG", env),
        dump_signal=setting("HETOBS_DUMP_SIGNAL", env),
        small_bytes=setting("HETOBS_SMALL_BYTES", env),
        bw_log=setting("HETOBS_BW_LOG", env),
        bw_log_interval=float(setting("HETOBS_BW_LOG_INTERVAL", env)),
        bw_log_file=setting("HETOBS_BW_LOG_FILE", env),
        debug=setting("HETOBS_DEBUG", env).upper(),
        otel_sample=min(1.0, float(setting("HETOBS_OTEL_SAMPLE", env))),
        torch_native=setting("HETOBS_TORCH_NATIVE", env),
        relay_chunk_bytes=setting("HETOBS_RELAY_CHUNK_BYTES", env),
        relay_slots=setting("HETOBS_RELAY_SLOTS", env),
    )
