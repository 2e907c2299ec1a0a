"""A complete tool executor service: one tool, a progress message, a result.

    antwort-grpc executor run examples.weather_executor:Weather --listen 127.0.0.1:50070
    antwort-grpc serve --executor 127.0.0.1:50070

A request whose tools include the function `get_weather` now has it run on this service.
"""

from __future__ import annotations

import json

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.sdk import ExecutorService, function_tool, text_result

FORECASTS = {"berlin": "12°C, rain", "lisbon": "21°C, sunny", "paris": "17°C, cloudy"}


class Weather(ExecutorService):
    name = "weather"

    async def list_tools(self) -> list[pb.ExecutorTool]:
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        return [function_tool("get_weather", "Current weather in a city", schema)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        city = str(json.loads(call.arguments or "{}").get("city", ""))
        progress(f"looking up {city}")
        forecast = FORECASTS.get(city.lower())
        if forecast is None:
            return text_result(f"no forecast for {city!r}", is_error=True)
        return text_result(f"{city}: {forecast}")
