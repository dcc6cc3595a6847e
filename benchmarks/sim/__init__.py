"""A vLLM-compatible simulated fleet: calibrated step-time engine behind vLLM's HTTP surface."""

from benchmarks.sim.config import Faults, SimConfig, SimError
from benchmarks.sim.engine import Engine
from benchmarks.sim.fleet import SimFleet
from benchmarks.sim.replica import Replica
from benchmarks.sim.timing import TimingModel

__all__ = ["Engine", "Faults", "Replica", "SimConfig", "SimError", "SimFleet", "TimingModel"]
