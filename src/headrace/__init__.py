"""headrace: MillWheel-style fault-tolerant stream processing for Python, on Apache Spark."""

from . import injectors
from .api import read, run, stream_df, table_df, watermarks
from .model import Computation, MonoidComputation, Record, Timer, key_by
from .monitor import status
from .topology import Topology

__all__ = ["Computation", "MonoidComputation", "Record", "Timer", "Topology", "key_by", "run", "read", "watermarks",
           "stream_df", "table_df", "status", "injectors"]
__version__ = "0.1.0"
