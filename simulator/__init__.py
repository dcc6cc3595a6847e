"""A vLLM-compatible simulated fleet: calibrated step-time engine behind vLLM's HTTP surface."""

from simulator.config import Faults, SimConfig, SimError
from simulator.engine import Engine
from simulator.fleet import SimFleet
from simulator.replica import Replica
from simulator.timing import TimingModel

__all__ = ["Engine", "Faults", "Replica", "SimConfig", "SimError", "SimFleet", "TimingModel"]
