// Structured output through the gateway's HTTP door with the official OpenAI JS SDK's helper:
// responses.parse with a zod schema (zodTextFormat), the answer parsed into an object.
// Usage: node structured.js [http://127.0.0.1:50080/v1]
"use strict";

const OpenAI = require("openai");
const { zodTextFormat } = require("openai/helpers/zod");
const { z } = require("zod");

const baseURL = process.argv[2] || "http://127.0.0.1:50080/v1";
const client = new OpenAI({ baseURL, apiKey: process.env.ANTWORT_TOKEN || "none", maxRetries: 0 });
const model = process.env.ANTWORT_MODEL || "";

const City = z.object({ city: z.string(), population: z.number().int() });

async function main() {
  const response = await client.responses.parse({
    model,
    input: "Which is the largest city of France, and how many people live there?",
    text: { format: zodTextFormat(City, "city") },
  });
  console.log(`status: ${response.status}`);
  console.log(`parsed: ${JSON.stringify(response.output_parsed)}`);
  console.log(`format: ${response.text.format.type} ${response.text.format.name}`);
}

main().catch((error) => {
  console.log(`failed: ${error.status || ""} ${error.message}`);
  process.exit(1);
});
