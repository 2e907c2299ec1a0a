"""The controls of a response in progress, one registry for every door: the cases of the contract's
`Control` oneof. A door routes and decodes each by its name here (the HTTP door's
`/v1/responses/{id}/{name}`); a new control added to the contract appears here by itself, and a
door that cannot decode it fails its test (tests/test_front.py)."""

from __future__ import annotations

from antwort_grpc import pb

CONTROLS: tuple[str, ...] = tuple(field.name for field in pb.Control.DESCRIPTOR.oneofs_by_name["control"].fields)
