"""Metric kinds and the label names each one carries (upstream koordlet's metric resources).

A kind is a fixed schema: every sample of it must carry exactly these labels, so one
query by a label subset (say, only ``pod_uid``) finds every series it means and nothing
else. Values are cores for CPU, bytes for memory, milli-cores for ``node_be``, ratios for
throttling and PSI.
"""

from __future__ import annotations

# Label names.
POD_UID = "pod_uid"
CONTAINER_ID = "container_id"
NUMA_NODE_ID = "numa_node_id"
HOST_APP_NAME = "host_app_name"
BE_RESOURCE = "be_resource"
BE_ALLOCATION = "be_allocation"
PSI_RESOURCE = "psi_resource"
PSI_PRECISION = "psi_precision"
PSI_DEGREE = "psi_degree"
QOS = "qos"
CACHE_ID = "cache_id"
RESCTRL_MB_TYPE = "resctrl_mb_type"

# node_be label values.
BE_RESOURCE_CPU = "cpu"
BE_ALLOCATION_USAGE = "usage"
BE_ALLOCATION_REQUEST = "request"
BE_ALLOCATION_REAL_LIMIT = "real-limit"

NODE_CPU_USAGE = "node_cpu_usage"
NODE_MEMORY_USAGE = "node_memory_usage"
NODE_MEMORY_USAGE_WITH_PAGE_CACHE = "node_memory_usage_with_page_cache"
NODE_NUMA_CPU_USAGE = "node_numa_cpu_usage"
NODE_NUMA_MEMORY_USAGE = "node_numa_memory_usage"
POD_CPU_USAGE = "pod_cpu_usage"
POD_MEMORY_USAGE = "pod_memory_usage"
POD_MEMORY_USAGE_WITH_PAGE_CACHE = "pod_memory_usage_with_page_cache"
CONTAINER_CPU_USAGE = "container_cpu_usage"
CONTAINER_MEMORY_USAGE = "container_memory_usage"
CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE = "container_memory_usage_with_page_cache"
SYS_CPU_USAGE = "sys_cpu_usage"
SYS_MEMORY_USAGE = "sys_memory_usage"
SYS_NUMA_CPU_USAGE = "sys_numa_cpu_usage"
SYS_NUMA_MEMORY_USAGE = "sys_numa_memory_usage"
HOST_APPLICATION_CPU_USAGE = "host_application_cpu_usage"
HOST_APPLICATION_MEMORY_USAGE = "host_application_memory_usage"
HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE = "host_application_memory_usage_with_page_cache"
NODE_BE = "node_be"
POD_CPU_THROTTLED = "pod_cpu_throttled"
CONTAINER_CPU_THROTTLED = "container_cpu_throttled"
POD_PSI = "pod_psi"
CONTAINER_PSI = "container_psi"
RESCTRL_LLC = "resctrl_resource_llc"
RESCTRL_MB = "resctrl_resource_mb"

_PSI = (PSI_RESOURCE, PSI_PRECISION, PSI_DEGREE)

SCHEMA: dict[str, tuple[str, ...]] = {
    NODE_CPU_USAGE: (),
    NODE_MEMORY_USAGE: (),
    NODE_MEMORY_USAGE_WITH_PAGE_CACHE: (),
    NODE_NUMA_CPU_USAGE: (NUMA_NODE_ID,),
    NODE_NUMA_MEMORY_USAGE: (NUMA_NODE_ID,),
    POD_CPU_USAGE: (POD_UID,),
    POD_MEMORY_USAGE: (POD_UID,),
    POD_MEMORY_USAGE_WITH_PAGE_CACHE: (POD_UID,),
    CONTAINER_CPU_USAGE: (CONTAINER_ID,),
    CONTAINER_MEMORY_USAGE: (CONTAINER_ID,),
    CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE: (CONTAINER_ID,),
    SYS_CPU_USAGE: (),
    SYS_MEMORY_USAGE: (),
    SYS_NUMA_CPU_USAGE: (NUMA_NODE_ID,),
    SYS_NUMA_MEMORY_USAGE: (NUMA_NODE_ID,),
    HOST_APPLICATION_CPU_USAGE: (HOST_APP_NAME,),
    HOST_APPLICATION_MEMORY_USAGE: (HOST_APP_NAME,),
    HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE: (HOST_APP_NAME,),
    NODE_BE: (BE_RESOURCE, BE_ALLOCATION),
    POD_CPU_THROTTLED: (POD_UID,),
    CONTAINER_CPU_THROTTLED: (CONTAINER_ID,),
    POD_PSI: (POD_UID, *_PSI),
    CONTAINER_PSI: (CONTAINER_ID, *_PSI),
    RESCTRL_LLC: (QOS, CACHE_ID),
    RESCTRL_MB: (QOS, CACHE_ID, RESCTRL_MB_TYPE),
}

# KV keys written by the NodeInfo collector.
NODE_CPU_INFO = "node_cpu_info"
NODE_NUMA_INFO = "node_numa_info"
