"""The op table's rows for the nvfp4_ds_mla cache format (352-byte records): its gather and its writer."""
