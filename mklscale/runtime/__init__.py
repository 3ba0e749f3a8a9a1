"""Runtime: Dask clusters from TOML configs (local, scheduler address, SLURM/PBS via dask-jobqueue)."""

from mklscale.runtime.cluster import (
    AddressConfig,
    ClusterConfig,
    JobqueueConfig,
    LocalConfig,
    PBSConfig,
    SlurmConfig,
    load_cluster_config,
    open_client,
)

__all__ = ["AddressConfig", "ClusterConfig", "JobqueueConfig", "LocalConfig", "PBSConfig", "SlurmConfig",
           "load_cluster_config", "open_client"]
