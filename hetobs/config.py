"""Every HETOBS_* setting, read from the environment in one place.

The README's settings table mirrors SETTINGS below; tests check that they agree.
Values are validated here so a typo fails at start-up with the variable's name,
not deep inside the transport.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, MutableMapping

__all__ = ["Settings", "SETTINGS", "NUMBER_SETTINGS", "SettingError", "from_env", "check_timeout", "Launch",
           "launch_from_env", "export_launch_env", "expand_hostlist"]


class SettingError(ValueError):
    """A HETOBS_* (or rendezvous) variable holds a value that cannot be used."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("HETOBS_JOB_ID", "SLURM_JOB_ID[.SLURM_STEP_ID], TORCHELASTIC_RUN_ID (not \"none\"), else made by rank 0",
            "Job identity: names the job directory and authenticates handshakes when no secret is set. "
            "Under srun the step id is part of it (1234.0, 1234.1: two steps of one allocation never share "
            "dumps). Without one, rank 0 makes an id and hands it to the other ranks at rendezvous (it logs it; "
            "`hetobs jobs` lists the jobs)."),
    Setting("HETOBS_DIR", "<tmp>/hetobs-<uid>", "Root of job directories; point it at shared storage on a cluster."),
    Setting("HETOBS_TRANSPORT", "auto", "auto (shared memory within a host, TCP across), shm, or tcp."),
    Setting("HETOBS_SOCKET_IFNAME", "(the route toward MASTER_ADDR)",
            "Interface whose IPv4 address the rank's listeners bind and advertise (NCCL_SOCKET_IFNAME's form: "
            "a prefix such as eth, =eth0 for an exact name, ^docker,lo to exclude, comma lists). Unset: the "
            "address the kernel uses toward MASTER_ADDR; 0.0.0.0 only when MASTER_ADDR is unset too."),
    Setting("HETOBS_SECRET", "(unset; hetobs run makes one)",
            "Shared secret: every handshake is authenticated with HMAC-SHA256 over a nonce. `hetobs run` without "
            "one makes a fresh one and stores it in the job directory (file `secret`, 0600), where `hetobs dump`, "
            "`diagnose` and the other commands of the job's owner find it when their environment has none."),
    Setting("HETOBS_TIMEOUT", "600", "Seconds an op may wait on a peer before it fails with a timeout naming that peer (inf: never; NaN and negatives are refused, as for every timeout)."),
    Setting("HETOBS_CONNECT_TIMEOUT", "60", "Seconds to wait for rendezvous and connections at start-up (inf: never)."),
    Setting("HETOBS_CONNECT_RETRIES", "100", "Attempts per connection (rendezvous, data links, side channel) before it fails naming the peer, its address and the attempts; back-off doubles from 10 ms to 1 s with jitter, HETOBS_CONNECT_TIMEOUT bounds it all (BCCL_IB_CONNECT_RETRY_CNT's role)."),
    Setting("HETOBS_RECONNECT_TIMEOUT", "30", "Seconds to re-make a broken TCP data link (fresh handshake, the op resumes at the last chunk received) before the op fails naming the link; also the TCP_USER_TIMEOUT of data sockets (0: no reconnect; inf: never give up)."),
    Setting("HETOBS_RECORDS", "2048", "Op records kept per rank (ring, oldest finished op overwritten; an op in flight keeps its record)."),
    Setting("HETOBS_HANG_TIMEOUT", "300", "Seconds without progress in an op before the watchdog dumps every rank (inf: never)."),
    Setting("HETOBS_WATCHDOG", "1", "0 turns off the watchdog, dumps, side-channel requests and the stats segment."),
    Setting("HETOBS_ABORT_ON_HANG", "0", "1: after the hang dump, fail the stuck op with an error instead of waiting."),
    Setting("HETOBS_DUMP_SIGNAL", "off", "A signal (name or number, e.g. SIGUSR2) that makes this rank dump; chains to prior handlers."),
    Setting("HETOBS_BW_LOG", "off", "Bandwidth log: off, verbose (a line per collective) or agg (per comm and op per interval)."),
    Setting("HETOBS_BW_LOG_INTERVAL", "15", "Seconds per aggregated bandwidth-log line (HETOBS_BW_LOG=agg)."),
    Setting("HETOBS_BW_LOG_FILE", "(stderr)", "Bandwidth log file; %h = host, %p = pid, %r = rank."),
    Setting("HETOBS_SMALL_BYTES", "65536", "all_reduce, all_gather (gathered size) and reduce_scatter (input size) payloads up to this size use the latency path (direct exchange; all_gather and reduce_scatter up to 8 ranks); on a communicator all on one host over shared memory, up to this size divided by (ranks - 1) (docs/algorithms.md). 0 forces the ring."),
    Setting("HETOBS_SHM_SINGLE_COPY_BYTES", "131072", "Shared-memory collective messages of at least this many bytes are read by the receiver straight out of the sender's buffer (one copy, process_vm_readv) instead of through the ring (two copies), where the kernel allows it (same uid, ptrace permitted; else the ring, logged at debug); a two-rank broadcast from 256 KiB splits that copy, the root writing the second half into the receiver's buffer (process_vm_writev). 4611686018427387904 (2^62) turns both off (docs/algorithms.md has the crossover)."),
    Setting("HETOBS_DEBUG", "WARN", "Native log level: ERROR, WARN, INFO or DEBUG (to stderr)."),
    Setting("HETOBS_TRACEBACK", "0", "1: `hetobs` commands print the Python traceback with an error."),
    Setting("HETOBS_REBUILD", "0", "1: scripts/setup.sh rebuilds the native core even when nothing changed."),
    Setting("HETOBS_TORCH_NATIVE", "1", "0: \"hetobs_gloo\", \"hetobs_nccl\" and wrap() run as a Python process group even where hetobs._torch_ext is built (a few to ~25 us more per small op; for comparison and debugging)."),
    Setting("HETOBS_RELAY_CHUNK_BYTES", "4194304", "Chunk size of the pipelined host relay (Communicator.relay, cross-island transfers): copy-in, wire and copy-out overlap chunk by chunk."),
    Setting("HETOBS_RELAY_SLOTS", "16", "Staging slots per direction of the pipelined host relay (chunks in flight each way; staging = slots x chunk bytes)."),
    Setting("HETOBS_OTEL_SAMPLE", "0.01", "Fraction of collectives exported as OpenTelemetry spans (0..1; chosen per communicator and sequence id, so every rank keeps the same ones)."),
    Setting("HETOBS_ISLAND", "(the island's device type)", "Name of this rank's island under \"hetobs_islands\": ranks with one name form an island (1-15 letters, digits, _ . -)."),
    Setting("HETOBS_ISLAND_DEVICE", "(torch's current accelerator, else cpu)", "Device type of this rank's island under \"hetobs_islands\" (cuda, npu, xpu, any device a vendor plugin registers with torch, or cpu); the device must be available on the rank."),
    Setting("HETOBS_ISLAND_BACKEND", "(torch's default for the device: nccl, hccl, xccl, gloo, ...)", "torch.distributed backend inside this rank's island: gloo, nccl, a vendor plugin's backend (hccl, xccl, ...) that carries the island's device, or hetobs for the native transport (cpu islands)."),
    Setting("HETOBS_RELAY_STAGE", "auto", "auto: device tensors cross islands through host staging (CUDA through its native lane, any other device through torch's device-generic API), host tensors go on the wire as they are; host: host tensors are staged too (a real copy per chunk, to exercise and measure the pipeline without a device); device: CUDA tensors take the device-generic lane too (for comparison)."),
    Setting("HETOBS_RELAY_PIPELINE", "1", "0: the relay copies everything in, sends everything, copies everything out (the unpipelined baseline, for comparison)."),
)


@dataclass(frozen=True)
class Settings:
    job_id: str
    job_id_generated: bool
    dir: str
    transport: str
    secret: str
    timeout: float
    connect_timeout: float
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
    otel_sample: float = 0.01
    torch_native: bool = True
    relay_chunk_bytes: int = 4 << 20
    relay_slots: int = 16
    connect_retries: int = 100  # read by the native core itself (common/env_config.cc netSettings)
    reconnect_timeout: float = 30.0
    job_id_from: str = ""  # the variable job_id came from (_job_id), "generated" when made here


@dataclass(frozen=True)
class NumberSetting:
    """How a numeric setting is read, here and in csrc/src/common/env_config.cc (kNumberSettings).

    Floats take inf (for a timeout: never) and refuse NaN; integers are bounded by `maximum`.
    tests/test_timeouts_inf.py checks that the native table says the same.
    """

    name: str
    default: str
    minimum: float
    integer: bool = False
    maximum: int | None = None


NUMBER_SETTINGS: dict[str, NumberSetting] = {n.name: n for n in (
    NumberSetting("HETOBS_TIMEOUT", "600", 0.001),
    NumberSetting("HETOBS_CONNECT_TIMEOUT", "60", 0.1),
    NumberSetting("HETOBS_CONNECT_RETRIES", "100", 1, integer=True, maximum=1000000),
    NumberSetting("HETOBS_RECONNECT_TIMEOUT", "30", 0.0),
    NumberSetting("HETOBS_RECORDS", "2048", 1, integer=True, maximum=1 << 30),
    NumberSetting("HETOBS_HANG_TIMEOUT", "300", 0.1),
    NumberSetting("HETOBS_SMALL_BYTES", "65536", 0, integer=True, maximum=1 << 62),
    NumberSetting("HETOBS_SHM_SINGLE_COPY_BYTES", "131072", 0, integer=True, maximum=1 << 62),
    NumberSetting("HETOBS_BW_LOG_INTERVAL", "15", 0.1),
    NumberSetting("HETOBS_OTEL_SAMPLE", "0.01", 0.0),
    NumberSetting("HETOBS_RELAY_CHUNK_BYTES", "4194304", 1, integer=True, maximum=1 << 30),
    NumberSetting("HETOBS_RELAY_SLOTS", "16", 1, integer=True, maximum=1024),
)}


def _number(env: Mapping[str, str], name: str) -> float | int:
    spec = NUMBER_SETTINGS[name]
    raw = env.get(name, spec.default)
    conv: Callable[[str], float | int] = int if spec.integer else float
    try:
        value = conv(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a number") from None
    if isinstance(value, float) and math.isnan(value):
        raise SettingError(f"{name}={raw!r}: expected a number, not NaN")
    minimum = int(spec.minimum) if spec.integer else spec.minimum
    if value < minimum:
        raise SettingError(f"{name}={raw!r}: must be at least {minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise SettingError(f"{name}={raw!r}: must be at most {spec.maximum}")
    return value


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


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, default)
    value = raw.strip().lower()
    if value not in choices:
        raise SettingError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return value


def _signal(env: Mapping[str, str], name: str) -> int:
    import signal

    raw = env.get(name, "off").strip()
    if raw.lower() in ("", "off", "0", "none"):
        return 0
    if raw.isdigit():
        num = int(raw)
    else:
        upper = raw.upper()
        sig = getattr(signal, upper if upper.startswith("SIG") else "SIG" + upper, None)
        if not isinstance(sig, signal.Signals):
            raise SettingError(f"{name}={raw!r}: not a signal name or number")
        num = int(sig)
    if num in (int(signal.SIGKILL), int(signal.SIGSTOP)) or not 0 < num < signal.NSIG:
        raise SettingError(f"{name}={raw!r}: cannot be caught")
    return num


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
        value = env.get(name, "").strip()
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


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting (raises SettingError naming the variable)."""
    env = os.environ if env is None else env
    job_id, job_id_from = _job_id(env)
    _number(env, "HETOBS_SHM_SINGLE_COPY_BYTES")  # read by the native core (env_config.cc); refused here first
    return Settings(
        job_id=job_id,
        job_id_generated=job_id_from == "generated",
        job_id_from=job_id_from,
        dir=env.get("HETOBS_DIR", "") or os.path.join(tempfile.gettempdir(), f"hetobs-{os.getuid()}"),
        transport=_choice(env, "HETOBS_TRANSPORT", "auto", ("auto", "shm", "tcp")),
        secret=env.get("HETOBS_SECRET", ""),
        timeout=float(_number(env, "HETOBS_TIMEOUT")),
        connect_timeout=float(_number(env, "HETOBS_CONNECT_TIMEOUT")),
        connect_retries=int(_number(env, "HETOBS_CONNECT_RETRIES")),
        reconnect_timeout=float(_number(env, "HETOBS_RECONNECT_TIMEOUT")),
        records=int(_number(env, "HETOBS_RECORDS")),
        hang_timeout=float(_number(env, "HETOBS_HANG_TIMEOUT")),
        watchdog=_choice(env, "HETOBS_WATCHDOG", "1", ("0", "1", "true", "false")) in ("1", "true"),
        abort_on_hang=_choice(env, "HETOBS_ABORT_ON_HANG", "0", ("0", "1", "true", "false")) in ("1", "true"),
        dump_signal=_signal(env, "HETOBS_DUMP_SIGNAL"),
        small_bytes=int(_number(env, "HETOBS_SMALL_BYTES")),
        bw_log=_choice(env, "HETOBS_BW_LOG", "off", ("off", "verbose", "agg")),
        bw_log_interval=float(_number(env, "HETOBS_BW_LOG_INTERVAL")),
        bw_log_file=env.get("HETOBS_BW_LOG_FILE", ""),
        debug=_choice(env, "HETOBS_DEBUG", "WARN", ("error", "warn", "info", "debug")).upper(),
        otel_sample=min(1.0, float(_number(env, "HETOBS_OTEL_SAMPLE"))),
        torch_native=_choice(env, "HETOBS_TORCH_NATIVE", "1", ("0", "1", "true", "false")) in ("1", "true"),
        relay_chunk_bytes=int(_number(env, "HETOBS_RELAY_CHUNK_BYTES")),
        relay_slots=int(_number(env, "HETOBS_RELAY_SLOTS")),
    )
