"""The one table of HETOBS_* settings: name, kind, default, bounds, choices, one line of doc.

Everything else is made from it:
- hetobs/config.py reads every setting through it (`config.setting`, `config.from_env`);
- the native core's table is generated from this file at build time (csrc/cmake/gen_settings.py
  writes settings_table.inc, which csrc/src/common/env_config.cc compiles in), so the C++
  parser that the MPI and NCCL interposers use has the same rows with no copy typed by hand;
- the README's settings table is rendered from it (scripts/settings_table.py --write).

Why generated rather than typed twice and compared: a comparison test only catches drift after
someone made it, and only where the test runs; a generated table cannot drift. The native module
still exports the table it was built with (`_core.settings_table()`) and tests/test_settings_table.py
compares it row by row, which catches a stale build (an extension built before this file changed).

Pure data on purpose: the build loads this file by path, before hetobs is importable, so it
imports nothing from hetobs (and nothing outside the standard library).

Kinds, read alike in both languages (a bad value is one error naming the variable and the value):
  float   Python's float(): inf allowed (a timeout that never fires), NaN refused, >= minimum
  int     Python's int(): minimum <= value <= maximum
  choice  stripped, lower-cased, one of `choices`
  flag    a choice of 0, 1, true, false; read as a bool
  signal  off (also "", 0, none), a signal's name (SIGUSR2 or USR2) or number; not KILL or STOP
  text    the value as given (no check here; its reader says what it must be)
"""

from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["Spec", "SETTINGS", "KINDS", "FLAG_CHOICES"]

KINDS = ("float", "int", "choice", "flag", "signal", "text")
FLAG_CHOICES = ("0", "1", "true", "false")


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    default: str  # the value read when the variable is unset ("" for text: none)
    doc: str
    shown: Optional[str] = None  # the README's Default cell when the default is worked out at run time
    minimum: Optional[float] = None  # float and int
    maximum: Optional[int] = None  # int
    choices: Tuple[str, ...] = ()  # choice (flag's are FLAG_CHOICES)

    @property
    def shown_default(self) -> str:
        return self.default if self.shown is None else self.shown


def _float(name: str, default: str, minimum: float, doc: str) -> Spec:
    return Spec(name, "float", default, doc, minimum=minimum)


def _int(name: str, default: str, minimum: int, maximum: int, doc: str) -> Spec:
    return Spec(name, "int", default, doc, minimum=minimum, maximum=maximum)


def _choice(name: str, default: str, choices: Tuple[str, ...], doc: str) -> Spec:
    return Spec(name, "choice", default, doc, choices=choices)


def _flag(name: str, default: str, doc: str) -> Spec:
    return Spec(name, "flag", default, doc, choices=FLAG_CHOICES)


def _text(name: str, shown: str, doc: str) -> Spec:
    return Spec(name, "text", "", doc, shown=shown)


# In the README's order.
SETTINGS: Tuple[Spec, ...] = (
    _text("HETOBS_JOB_ID", "SLURM_JOB_ID[.SLURM_STEP_ID], TORCHELASTIC_RUN_ID (not \"none\"), else made by rank 0",
          "Job identity: names the job directory and authenticates handshakes when no secret is set. "
          "Under srun the step id is part of it (1234.0, 1234.1: two steps of one allocation never share "
          "dumps). Without one, rank 0 makes an id and hands it to the other ranks at rendezvous (it logs it; "
          "`hetobs jobs` lists the jobs)."),
    _text("HETOBS_DIR", "<tmp>/hetobs-<uid>", "Root of job directories; point it at shared storage on a cluster."),
    _choice("HETOBS_TRANSPORT", "auto", ("auto", "shm", "tcp"),
            "auto (shared memory within a host, TCP across), shm, or tcp."),
    _text("HETOBS_SOCKET_IFNAME", "(the route toward MASTER_ADDR)",
          "Interface whose IPv4 address the rank's listeners (the interposers' side channels too) bind and "
          "advertise (NCCL_SOCKET_IFNAME's form: a prefix such as eth, =eth0 for an exact name, ^docker,lo to "
          "exclude, comma lists). Unset: the address the kernel uses toward MASTER_ADDR; 0.0.0.0 only when "
          "MASTER_ADDR is unset too (an interposer, which must advertise an address, then takes the default "
          "route's, else the first interface that is up)."),
    _text("HETOBS_SECRET", "(unset; hetobs run makes one)",
          "Shared secret: every handshake is authenticated with HMAC-SHA256 over a nonce. `hetobs run` without "
          "one makes a fresh one and stores it in the job directory (file `secret`, 0600), where `hetobs dump`, "
          "`diagnose` and the other commands of the job's owner find it when their environment has none."),
    _float("HETOBS_TIMEOUT", "600", 0.001,
           "Seconds an op may wait on a peer before it fails with a timeout naming that peer (inf: never; NaN and "
           "negatives are refused, as for every timeout)."),
    _float("HETOBS_CONNECT_TIMEOUT", "60", 0.1,
           "Seconds to wait for rendezvous and connections at start-up (inf: never)."),
    _int("HETOBS_CONNECT_RETRIES", "100", 1, 1000000,
         "Attempts per connection (rendezvous, data links, side channel) before it fails naming the peer, its "
         "address and the attempts; back-off doubles from 10 ms to 1 s with jitter, HETOBS_CONNECT_TIMEOUT "
         "bounds it all (BCCL_IB_CONNECT_RETRY_CNT's role)."),
    _float("HETOBS_RECONNECT_TIMEOUT", "30", 0.0,
           "Seconds to re-make a broken TCP data link (fresh handshake, the op resumes at the last chunk received) "
           "before the op fails naming the link; also the TCP_USER_TIMEOUT of data sockets (0: no reconnect; inf: "
           "never give up)."),
    _int("HETOBS_RECORDS", "2048", 1, 1 << 30,
         "Op records kept per rank (ring, oldest finished op overwritten; an op in flight keeps its record)."),
    _float("HETOBS_HANG_TIMEOUT", "300", 0.1,
           "Seconds without progress in an op before the watchdog dumps every rank (inf: never)."),
    _float("HETOBS_SUSPECT_FACTOR", "4", 1.0,
           "Suspected hang: an op without progress this many times longer than the longest wait the watchdog has "
           "seen in a completed op of its communicator is dumped job-wide at once, marked suspected (the job is "
           "not touched; HETOBS_HANG_TIMEOUT confirms)."),
    _float("HETOBS_SUSPECT_FLOOR", "5", 0.1,
           "Seconds without progress before any op can be a suspected hang, whatever the history (inf: no "
           "suspected stage, only HETOBS_HANG_TIMEOUT)."),
    _int("HETOBS_SUSPECT_HISTORY", "20", 0, 1 << 30,
         "Ops a communicator issues before its waits are history (start-up: connections, ranks still loading); "
         "suspicion arms once as many more were issued."),
    _flag("HETOBS_WATCHDOG", "1", "0 turns off the watchdog, dumps, side-channel requests and the stats segment."),
    _flag("HETOBS_ABORT_ON_HANG", "0",
          "1: after the hang dump, fail the stuck op with an error instead of waiting."),
    Spec("HETOBS_DUMP_SIGNAL", "signal", "off",
         "A signal (name or number, e.g. SIGUSR2) that makes this rank dump; chains to prior handlers."),
    _choice("HETOBS_BW_LOG", "off", ("off", "verbose", "agg"),
            "Bandwidth log: off, verbose (a line per collective) or agg (per comm and op per interval)."),
    _float("HETOBS_BW_LOG_INTERVAL", "15", 0.1, "Seconds per aggregated bandwidth-log line (HETOBS_BW_LOG=agg)."),
    _text("HETOBS_BW_LOG_FILE", "(stderr)", "Bandwidth log file; %h = host, %p = pid, %r = rank."),
    _int("HETOBS_SMALL_BYTES", "65536", 0, 1 << 62,
         "all_reduce, all_gather (gathered size) and reduce_scatter (input size) payloads up to this size use the "
         "latency path (direct exchange; all_gather and reduce_scatter up to 8 ranks); on a communicator all on "
         "one host over shared memory, up to this size divided by (ranks - 1), and all_reduce there up to a quarter "
         "of it at most, cma above; from 3 ranks there, all_gather and reduce_scatter above it go through the "
         "peers' memory too (cma; docs/algorithms.md). 0 forces the ring."),
    _int("HETOBS_SHM_SINGLE_COPY_BYTES", "131072", 0, 1 << 62,
         "Shared-memory collective messages of at least this many bytes are read by the receiver straight out of "
         "the sender's buffer (one copy, process_vm_readv) instead of through the ring (two copies), where the "
         "kernel allows it (same uid, ptrace permitted; else the ring, logged at debug); a two-rank broadcast "
         "from 256 KiB splits that copy, the root writing the second half into the receiver's buffer "
         "(process_vm_writev). 4611686018427387904 (2^62) turns both off, and with them the collectives through the "
         "peers' memory (cma) on every communicator this rank is in (docs/algorithms.md has the crossover)."),
    _flag("HETOBS_DIGEST", "0",
          "1: compare a digest of each sampled all_reduce, all_gather and broadcast result across the ranks of the "
          "native transport or of the wrapped Gloo backend (what must be bit-identical everywhere): a rank whose "
          "result differs is named, with "
          "the op, its seq and the first differing element (docs/digests.md)."),
    _float("HETOBS_DIGEST_RATE", "0.03125", 0.0,
           "With HETOBS_DIGEST=1, the share of those collectives checked: every round(1/rate)-th sequence id, the "
           "same ops on every rank (1: every op; the default, every 32nd, keeps the hash under 3% of an all_reduce "
           "of 1-16 MiB: docs/digests.md)."),
    _choice("HETOBS_DIGEST_ACTION", "raise", ("raise", "log"),
            "What a data mismatch does: raise (the op raises DataMismatchError on every rank, after the dump) or "
            "log (warn, count, dump, and go on)."),
    _text("HETOBS_TEST_FLIP_BIT", "(off)",
          "TEST ONLY: SEQ[:ELEMENT[:BIT]] flips one bit of this rank's result of the all_reduce, all_gather or "
          "broadcast with that sequence id (any communicator), as silent data corruption would."),
    _choice("HETOBS_DEBUG", "WARN", ("error", "warn", "info", "debug"),
            "Native log level: ERROR, WARN, INFO or DEBUG (to stderr)."),
    # Read leniently by the CLI's error handler (any value but "" and 0 turns it on): an error
    # while reporting an error would hide the first one.
    Spec("HETOBS_TRACEBACK", "text", "0", "1: `hetobs` commands print the Python traceback with an error."),
    _flag("HETOBS_REBUILD", "0", "1: scripts/setup.sh rebuilds the native core even when nothing changed."),
    _flag("HETOBS_TORCH_NATIVE", "1",
          "0: \"hetobs_gloo\", \"hetobs_nccl\" and wrap() run as a Python process group even where "
          "hetobs._torch_ext is built (a few to ~25 us more per small op; for comparison and debugging)."),
    _int("HETOBS_RELAY_CHUNK_BYTES", "4194304", 1, 1 << 30,
         "Chunk size of the pipelined host relay (Communicator.relay, cross-island transfers): copy-in, wire and "
         "copy-out overlap chunk by chunk."),
    _int("HETOBS_RELAY_SLOTS", "16", 1, 1024,
         "Staging slots per direction of the pipelined host relay (chunks in flight each way; staging = slots x "
         "chunk bytes)."),
    # Values above 1 read as 1 (every collective), as they always have.
    _float("HETOBS_OTEL_SAMPLE", "0.01", 0.0,
           "Fraction of collectives exported as OpenTelemetry spans (0..1; chosen per communicator and sequence "
           "id, so every rank keeps the same ones)."),
    _text("HETOBS_ISLAND", "(the island's device type)",
          "Name of this rank's island under \"hetobs_islands\": ranks with one name form an island (1-15 letters, "
          "digits, _ . -)."),
    _text("HETOBS_ISLAND_DEVICE", "(torch's current accelerator, else cpu)",
          "Device type of this rank's island under \"hetobs_islands\" (cuda, npu, xpu, any device a vendor plugin "
          "registers with torch, or cpu); the device must be available on the rank."),
    _text("HETOBS_ISLAND_BACKEND", "(torch's default for the device: nccl, hccl, xccl, gloo, ...)",
          "torch.distributed backend inside this rank's island: gloo, nccl, a vendor plugin's backend (hccl, "
          "xccl, ...) that carries the island's device, or hetobs for the native transport (cpu islands)."),
    _choice("HETOBS_RELAY_STAGE", "auto", ("auto", "host", "device"),
            "auto: device tensors cross islands through host staging (CUDA through its native lane, any other "
            "device through torch's device-generic API), host tensors go on the wire as they are; host: host "
            "tensors are staged too (a real copy per chunk, to exercise and measure the pipeline without a "
            "device); device: CUDA tensors take the device-generic lane too (for comparison)."),
    _choice("HETOBS_RELAY_PIPELINE", "1", ("0", "1"),
            "0: the relay copies everything in, sends everything, copies everything out (the unpipelined "
            "baseline, for comparison)."),
)
