"""Registering servicers so that a malformed protobuf message gets a precise answer.

grpc's generated ``add_*Servicer_to_server`` deserialize requests with ``FromString``; bytes
that are not a valid message raise inside grpc and the caller gets UNKNOWN, with a traceback
in the hub's log. Here each method's deserializer returns a :class:`Malformed` marker instead,
and a thin wrapper answers INVALID_ARGUMENT naming the message type and the parse error — for
a unary request before the servicer runs, for a request stream at the bad message. Nothing
reaches a servicer that did not parse.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from edgefleet.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Malformed:
    type_name: str
    error: str

    @property
    def message(self) -> str:
        return f"malformed {self.type_name} message: {self.error}"


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Malformed(cls.DESCRIPTOR.full_name, str(exc))

    return parse


async def _checked_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for item in requests:
        if isinstance(item, Malformed):
            log.warning("malformed message", type=item.type_name, error=item.error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, item.message)
        yield item


def _wrap(method: Callable[..., Any], client_streaming: bool, server_streaming: bool) -> Any:
    if client_streaming:
        if server_streaming:

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for out in method(_checked_stream(requests, context), context):
                    yield out

            return stream_stream

        async def stream_unary(requests: Any, context: Any) -> Any:
            return await method(_checked_stream(requests, context), context)

        return stream_unary

    async def reject(request: Malformed, context: Any) -> None:
        log.warning("malformed message", type=request.type_name, error=request.error)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)

    if server_streaming:

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Malformed):
                await reject(request, context)
            async for out in method(request, context):
                yield out

        return unary_stream

    async def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await reject(request, context)
        return await method(request, context)

    return unary_unary


def add_servicer(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Register every method of ``service`` that ``servicer`` implements (see module doc)."""
    handlers = {}
    for m in service.methods:
        request_cls = message_factory.GetMessageClass(m.input_type)
        response_cls = message_factory.GetMessageClass(m.output_type)
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = kind(
            _wrap(getattr(servicer, m.name), m.client_streaming, m.server_streaming),
            request_deserializer=_deserializer(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(service.full_name, handlers)]
    )
