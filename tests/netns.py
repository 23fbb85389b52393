"""Network namespaces as stand-in hosts for tests (root only).

`Hosts(n)` makes n namespaces ("hosts") plus a "switch" namespace holding a bridge
that joins them, so nothing touches the root namespace's interfaces or firewall.
Addresses come from 198.18.0.0/15 (the range set aside for network benchmarks).

Everything is removed in `close()` (and by the context manager), even when a test
fails: deleting a namespace deletes its interfaces and its iptables rules with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

__all__ = ["Hosts", "Impairment", "netns_available", "NETNS_SKIP_REASON"]


def _run(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


def _why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if not shutil.which("ip"):
        return "iproute2's `ip` is not installed (scripts/setup.sh installs it)"
    probe = f"hetobs-probe-{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot create a network namespace here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return None


NETNS_SKIP_REASON = _why_unavailable()


def netns_available() -> bool:
    return NETNS_SKIP_REASON is None


class Hosts:
    """n namespaces ("hosts") on one bridge; host i has address 198.18.0.(i+1)."""

    def __init__(self, n: int) -> None:
        tag = uuid.uuid4().hex[:6]
        self.switch = f"hsw-{tag}"
        self.names = [f"hh{i}-{tag}" for i in range(n)]
        self.addrs = [f"198.18.0.{i + 1}" for i in range(n)]
        self._made: list[str] = []
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str) -> None:
        _run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            host_if, sw_if = "eth0", f"p{i}"
            _run("ip", "link", "add", f"v{i}{tag}", "netns", ns, "type", "veth", "peer", "name", sw_if,
                 "netns", self.switch)
            _run("ip", "-n", ns, "link", "set", f"v{i}{tag}", "name", host_if)
            _run("ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", host_if)
            _run("ip", "-n", ns, "link", "set", host_if, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.switch, "link", "set", sw_if, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", sw_if, "up")

    def prefix(self, i: int) -> list[str]:
        """argv prefix that runs a command on host i."""
        return ["ip", "netns", "exec", self.names[i]]

    def named_prefix(self, i: int, name: str) -> list[str]:
        """argv prefix that runs a command on host i under hostname `name` (a UTS namespace of
        its own, so ranks on different "hosts" report different host names)."""
        return [*self.prefix(i), "unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh"]

    def pids(self, i: int) -> list[int]:
        """Every process running in host i's network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def run(self, i: int, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(i), *args], check=True, capture_output=True, text=True, timeout=30)

    def link_down(self, i: int) -> None:
        """Cut host i off (its switch port goes down)."""
        _run("ip", "-n", self.switch, "link", "set", f"p{i}", "down")

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._made.clear()

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def add_local_interface(hosts: Hosts, i: int, name: str, addr: str) -> None:
    """Give host i a second interface `name` with `addr`/24, reachable from host i only.

    A veth pair with both ends inside host i (no dummy module needed); it goes when the
    namespace does (Hosts.close).
    """
    ns = hosts.names[i]
    _run("ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", name + "p")
    _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", name)
    _run("ip", "-n", ns, "link", "set", name, "up")
    _run("ip", "-n", ns, "link", "set", name + "p", "up")


# --- link faults and limits (appended for tests/test_link_health.py) ---------------------------

def drop_outgoing(hosts: Hosts, i: int, to: int) -> None:
    """Host i's packets to host `to` vanish (iptables DROP in host i's OUTPUT); gone with the namespace."""
    hosts.run(i, "iptables", "-A", "OUTPUT", "-d", hosts.addrs[to], "-j", "DROP")


def rate_limit(hosts: Hosts, i: int, rate: str = "20mbit") -> None:
    """Host i sends at most `rate` (tc tbf on its interface; this kernel has no netem). Gone with the namespace."""
    hosts.run(i, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kbit",
              "latency", "400ms")


def drop_incoming(hosts: Hosts, i: int, frm: int) -> None:
    """Host i hears nothing from host `frm` (iptables DROP in host i's INPUT); gone with the namespace."""
    hosts.run(i, "iptables", "-A", "INPUT", "-s", hosts.addrs[frm], "-j", "DROP")


def link_up(hosts: Hosts, i: int) -> None:
    """Bring host i's switch port back up (undoes Hosts.link_down)."""
    _run("ip", "-n", hosts.switch, "link", "set", f"p{i}", "up")


def reset_tcp_for(hosts: Hosts, i: int, seconds: float) -> tuple[int, float]:
    """Host i answers every TCP segment it receives with a reset (REJECT in its INPUT) for
    `seconds`; returns (segments rejected, how long the rule was in place, measured in host i).

    One shell inside host i inserts, waits, counts and deletes: the fault lasts `seconds` plus
    two iptables runs, not plus the start-up of further `ip netns exec` processes, which take
    hundreds of ms on a loaded machine and made a "1 s" fault last 1.5 s. If the shell dies
    half-way the rule goes with the namespace (Hosts.close).
    """
    rule = "INPUT -p tcp -j REJECT --reject-with tcp-reset"
    script = (f"iptables -I {rule} && t0=$(date +%s.%N) && sleep {seconds}; "
              "n=$(iptables -nvxL INPUT | awk '/REJECT/ {s += $1} END {print s + 0}'); "
              f"iptables -D {rule}; echo $n $t0 $(date +%s.%N)")
    out = hosts.run(i, "sh", "-c", script).stdout.split()
    return int(out[0]), float(out[2]) - float(out[1])


# Every TCP segment arriving on the host's interface but a reset is answered with a reset.
RESET_RULE = "INPUT -i eth0 -p tcp ! --tcp-flags RST RST -j REJECT --reject-with tcp-reset"


def reset_bursts(hosts: Hosts, i: int, count: int, seconds: float, gap: float) -> subprocess.Popen[str]:
    """Start `count` bursts of TCP resets on host i: each `seconds` long, `gap` seconds apart.

    For each burst host i answers every TCP segment arriving on its network interface (not
    loopback: a network fault never touches traffic inside the host) with a reset, except
    resets themselves: with bursts on both hosts at once, a rule that also rejected (dropped)
    the other host's resets would turn both directions into a blackhole, survived by plain
    retransmission without any reset seen. One
    shell in host i runs all bursts, so their timing holds on a loaded machine; it prints,
    per burst, "segments-rejected start end" (host i's clock). Returns the running shell:
    read it with `burst_results`. If the shell dies half-way the rule goes with the
    namespace (Hosts.close).
    """
    rule = RESET_RULE
    # set -e: a rule that failed to go in or out ends the script with an error (burst_results
    # raises), and the check at the end proves none is left behind.
    one = (f"iptables -w -I {rule}; t0=$(date +%s.%N); sleep {seconds}; "
           "n=$(iptables -w -nvxL INPUT | awk '/REJECT/ {s += $1} END {print s + 0}'); "
           f"iptables -w -D {rule}; echo $n $t0 $(date +%s.%N)")
    script = (f"set -e; for k in $(seq {count}); do {one}; sleep {gap}; done; "
              "test $(iptables -w -S INPUT | grep -c REJECT) -eq 0")
    return subprocess.Popen([*hosts.prefix(i), "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def burst_results(proc: subprocess.Popen[str], timeout: float = 60) -> list[tuple[int, float]]:
    """(segments rejected, seconds the rule was in place) per burst of `reset_bursts`."""
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"reset bursts failed ({proc.returncode}): {err}")
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [(int(r[0]), float(r[2]) - float(r[1])) for r in rows]


class Impairment:
    """Loss, delay and jitter on one direction of one address pair (a user-space netem).

    This kernel has no netem qdisc. Host i's switch port is moved onto a bridge of its own,
    joined to the switch's bridge through two tap devices that tests/_impair_bridge.py forwards
    between: every frame to and from host i passes through that process, and IPv4 frames from
    host `src` to host `dst` are dropped with probability `loss` and held `delay` +- `jitter`
    seconds (uniform; frames reorder, as with netem's jitter). Other frames pass at once.
    `close()` puts the port back and returns the forwarder's counts; the namespace's deletion
    (Hosts.close) removes all of it in any case.
    """

    def __init__(self, hosts: Hosts, i: int, src: int, dst: int, *, loss: float, delay: float,
                 jitter: float) -> None:
        self.hosts, self.i = hosts, i
        sw = hosts.switch
        self.a, self.b, self.br = f"ta{i}", f"tb{i}", f"bi{i}"
        self.proc: subprocess.Popen[str] | None = None
        for args in (("link", "add", self.br, "type", "bridge"), ("link", "set", self.br, "up"),
                     ("tuntap", "add", "dev", self.a, "mode", "tap"), ("tuntap", "add", "dev", self.b, "mode", "tap")):
            _run("ip", "-n", sw, *args)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_impair_bridge.py")
        self.proc = subprocess.Popen(["ip", "netns", "exec", sw, sys.executable, script, "--a", self.a, "--b", self.b,
                                      "--src", hosts.addrs[src], "--dst", hosts.addrs[dst], "--loss", str(loss),
                                      "--delay", str(delay), "--jitter", str(jitter)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("READY"):
            raise RuntimeError(f"impairment forwarder did not start: {line} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        _run("ip", "-n", sw, "link", "set", self.a, "master", "br0", "up")
        _run("ip", "-n", sw, "link", "set", self.b, "master", self.br, "up")
        _run("ip", "-n", sw, "link", "set", f"p{i}", "master", self.br)

    def close(self) -> dict[str, int]:
        """Undo (host i back on the switch's bridge) and return the forwarder's counts."""
        if self.proc is None:
            return {}
        subprocess.run(["ip", "-n", self.hosts.switch, "link", "set", f"p{self.i}", "master", "br0"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.proc = None
        lines = [l for l in out.splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
