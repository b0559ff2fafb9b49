"""The analysis of one trace. Names the reports share with it live here, importable without
polars or numpy (a cached report renders without loading them)."""

CAUSES = ("kernel wait", "host sync", "dataloader", "kernel launch", "host work", "python")
"""Idle-gap causes (:func:`tracedx.analysis.timeline.idle_gaps`), in report order."""
HOST_DEVICE_COPY = "host-device copy"
"""The ``kernel_kind`` of an op group whose device time is mostly host-device memcpys
(:func:`tracedx.analysis.ops.op_groups`)."""
UNDERFILLED_FRACTION = 0.1
"""An op runs *under-filled* below this fraction of its roofline bound with fewer thread blocks
than SMs (:func:`tracedx.analysis.roofline.place_on_roofline`)."""
