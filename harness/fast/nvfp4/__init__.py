"""The GPU fast path's fused checks of the nvfp4_ds_mla ops (352-byte records), beside the fp8_ds_mla ones
they borrow their helpers from (../gather.py, ../writer.py)."""
