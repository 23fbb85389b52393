"""The demo job: N ranks on the native transport, one injected fault, the watchdog's
dumps and the diagnosis — the whole product on one machine (`hetobs demo`). The fault
suite of the tests drives the same code."""

from .runner import FAULTS, DemoResult, run_demo

__all__ = ["FAULTS", "DemoResult", "run_demo"]
