"""Every NOT_FOUND names what was not found in google.rpc.ResourceInfo (grpcio-status rich error
details): a response by its id, wherever the id came from, and a model the backend does not serve
(tests/providers/test_local_model.py)."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.harness import running_gateway

MISSING = "resp_0123456789abcdef"


def resource_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ResourceInfo:
    status = rpc_status.from_call(error)
    assert status is not None, "the error carries google.rpc.Status details"
    found = []
    for detail in status.details:
        info = error_details_pb2.ResourceInfo()
        if detail.Unpack(info):
            found.append(info)
    assert len(found) == 1, status
    return found[0]


async def not_found(call: Awaitable[object]) -> error_details_pb2.ResourceInfo:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    return resource_info(raised.value)


async def test_every_rpc_that_does_not_find_a_response_names_it_in_resource_info() -> None:
    provider = ScriptedProvider([[Text("hello")]], repeat=True)
    async with running_gateway(provider=provider) as gw:
        stub = gw.stub
        calls = {
            "GetResponse": stub.GetResponse(pb.GetResponseRequest(response_id=MISSING)),
            "DeleteResponse": stub.DeleteResponse(pb.DeleteResponseRequest(response_id=MISSING)),
            "ListInputItems": stub.ListInputItems(pb.ListInputItemsRequest(response_id=MISSING)),
            "CancelResponse": stub.CancelResponse(pb.CancelResponseRequest(response_id=MISSING)),
            "ControlResponse": stub.ControlResponse(
                pb.ControlResponseRequest(response_id=MISSING, control=pb.Control(pause=pb.PauseControl()))
            ),
            "CreateResponse(previous_response_id)": gw.create(
                pb.CreateResponseRequest(input_text="and then?", previous_response_id=MISSING)
            ),
        }
        for rpc, call in calls.items():
            info = await not_found(call)
            assert (info.resource_type, info.resource_name) == ("antwort.v1.Response", MISSING), rpc
