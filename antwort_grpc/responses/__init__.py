"""The transport-neutral responses layer: validation, create / get / delete / cancel / control
with the cross-replica path, and the mapping of failures to typed errors. Front doors (the gRPC
servicer) only adapt it."""
