// A Node client of the gateway's Open Responses HTTP door, on the official OpenAI JS SDK from npm:
// a streamed conversation with a function-tool round trip (previous_response_id), then an error
// as the SDK's exception type. Usage: node client.js [http://127.0.0.1:50080/v1]
// It needs a model that calls the tool it is offered: `make run-tools` runs one.
"use strict";

const OpenAI = require("openai");

const baseURL = process.argv[2] || "http://127.0.0.1:50080/v1";
const client = new OpenAI({ baseURL, apiKey: process.env.ANTWORT_TOKEN || "none", maxRetries: 0 });
const model = process.env.ANTWORT_MODEL || "";
const tools = [
  {
    type: "function",
    name: "get_weather",
    description: "Current weather of a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    strict: false,
  },
];

async function streamed(request) {
  const stream = await client.responses.create({ ...request, model, tools, stream: true });
  const types = [];
  let text = "";
  let final = null;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "response.output_text.delta") text += event.delta;
    if (event.type === "response.completed" || event.type === "response.failed") final = event.response;
  }
  return { types, text, final };
}

async function main() {
  const first = await streamed({ input: "What is the weather in Paris?" });
  console.log("stream: " + first.types.join(" "));
  const call = first.final.output.find((item) => item.type === "function_call");
  if (!call) {
    console.log("the model called no tool: start the gateway with `make run-tools`");
    process.exit(1);
  }
  console.log(`call: ${call.name} ${call.arguments}`);
  const second = await streamed({
    previous_response_id: first.final.id,
    input: [{ type: "function_call_output", call_id: call.call_id, output: JSON.stringify({ temp: 21 }) }],
  });
  console.log("completed: " + second.text);
  console.log("previous: " + (second.final.previous_response_id === first.final.id));
  try {
    await client.responses.retrieve("resp_missing");
  } catch (error) {
    console.log(`get_missing: ${error.status} ${error.constructor.name}`);
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(2);
});
