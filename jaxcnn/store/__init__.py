"""Profile store: per-layer timings, model predictions, memory plans and sparsity in one SQLite file.

    from jaxcnn.store import Store

    with Store() as store:                      # $JAXCNN_DB or ./jaxcnn_profiles.sqlite
        run = store.add_run("profile", model="resnet50", device="gpu", environment={...})
        conv1, = store.add_layers(run, [{"idx": 0, "name": "conv1", "op": "conv2d"}])
        store.add_measurements(run, [{"layer_id": conv1, "backend": "jaxcnn",
                                      "metric": "device_time_ms", "median": 0.41}])
        store.runs(); store.measurements(run)  # pandas DataFrames

    with store.transaction():                   # several writes, all or nothing
        ...
    with Store(path, read_only=True) as store:  # readers: never create, migrate or write the file
        ...

Every error about the file itself (missing, read-only, corrupt, foreign, damaged schema) is a
StoreError naming the path, raised when the Store is opened.
Writers need only the standard library; readers and exports need pandas.
"""

from jaxcnn.store._db import BUSY_TIMEOUT_S, DEFAULT_FILENAME, PATH_ENV_VAR, StoreError
from jaxcnn.store._portable import Export, read_export, write_export
from jaxcnn.store._schema import APPLICATION_ID, SCHEMA_VERSION
from jaxcnn.store._store import TABLES, Store

__all__ = [
    "APPLICATION_ID",
    "BUSY_TIMEOUT_S",
    "DEFAULT_FILENAME",
    "PATH_ENV_VAR",
    "SCHEMA_VERSION",
    "TABLES",
    "Export",
    "Store",
    "StoreError",
    "read_export",
    "write_export",
]
