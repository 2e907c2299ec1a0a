// The conversation both Node examples hold (client.js loads the protos from files, reflection.js
// asks the server): a streamed answer, a function tool round trip, the google.rpc.BadRequest
// details of an INVALID_ARGUMENT, and CancelResponse on a running answer. One transcript line per
// step. Messages are plain objects in proto-loader's shape: keepCase (snake_case fields) and
// oneofs (a oneof's name holds the name of the field that is set). The gateway must run a model
// that calls tools: `make run-tools` (a scripted stand-in model) does; the embedded model of
// `make run` does not.
'use strict';

const protobuf = require('protobufjs');

// google.protobuf.Struct is a map of Values, not a JSON object, and its shape depends on where the
// type came from. From .proto files (proto-loader), the well-known types are protobufjs's bundled
// definitions: a real map with camelCase fields, {fields: {city: {stringValue: 'x'}}}. From
// reflection, Struct is rebuilt from its descriptor, where a map is a repeated entry message and
// fields keep the .proto's snake_case: {fields: [{key: 'city', value: {string_value: 'x'}}]}.
// structOf(shape) gives the converter for one of them; pass JSON-like objects everywhere else.
function structOf({ entries }) {
  const name = entries ? (camel) => camel.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`) : (camel) => camel;
  const toValue = (value) => {
    if (value === null || value === undefined) return { [name('nullValue')]: 'NULL_VALUE' };
    if (Array.isArray(value)) return { [name('listValue')]: { values: value.map(toValue) } };
    switch (typeof value) {
      case 'number': return { [name('numberValue')]: value };
      case 'string': return { [name('stringValue')]: value };
      case 'boolean': return { [name('boolValue')]: value };
      default: return { [name('structValue')]: toStruct(value) };
    }
  };
  const toStruct = (object) => {
    const pairs = Object.entries(object).map(([key, value]) => [key, toValue(value)]);
    return { fields: entries ? pairs.map(([key, value]) => ({ key, value })) : Object.fromEntries(pairs) };
  };
  return toStruct;
}

// google.rpc.Status from the grpc-status-details-bin trailer, with the one detail type we read.
const rpc = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message BadRequest {
    message FieldViolation { string field = 1; string description = 2; }
    repeated FieldViolation field_violations = 1;
  }
`, { keepCase: true }).root;

function badRequestDetails(error) {
  const [bytes] = error.metadata.get('grpc-status-details-bin');
  if (!bytes) return [];
  const status = rpc.lookupType('google.rpc.Status').decode(bytes);
  return status.details
    .filter((detail) => detail.type_url.endsWith('/google.rpc.BadRequest'))
    .flatMap((detail) => rpc.lookupType('google.rpc.BadRequest').decode(detail.value).field_violations);
}

const TERMINAL = ['completed', 'requires_action', 'incomplete', 'failed', 'cancelled'];
const CODES = { 3: 'INVALID_ARGUMENT', 5: 'NOT_FOUND' };

// Streams one response: the event kinds, the text, the terminal event, and the response id.
function run(client, request, onEvent = () => {}) {
  return new Promise((resolve, reject) => {
    const result = { kinds: [], text: '', last: null, responseId: '' };
    const deadline = new Date(Date.now() + 30000);
    const call = client.CreateResponse({ ...request, stream: true }, { deadline });
    call.on('data', ({ event }) => {
      result.kinds.push(event.event);
      if (event.created) result.responseId = event.created.response.id;
      if (event.output_text_delta) result.text += event.output_text_delta.delta;
      if (TERMINAL.includes(event.event)) result.last = event;
      onEvent(event, result);
    });
    call.on('error', reject);
    call.on('end', () => resolve(result));
  });
}

const WEATHER_SCHEMA = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };

// What to do when the model answers instead of calling the tool.
const NO_TOOL_HINT = 'the model called no tool: start the gateway with `make run-tools` (the embedded model of `make run` calls none)';

// client: a ResponsesService client; toStruct: structOf(...) for how its types were loaded.
async function converse(client, toStruct) {
  const weatherTool = { function: { name: 'get_weather', parameters: toStruct(WEATHER_SCHEMA) } };
  const hello = await run(client, { input_text: 'Say hello in French.' });
  console.log(`stream: ${hello.kinds.join(' ')}`);
  console.log(`text: ${hello.text}`);

  const first = await run(client, { input_text: 'Weather in Paris?', tools: [weatherTool] });
  if (first.last.event !== 'requires_action') {
    throw new Error(`expected requires_action, got ${first.last.event}: ${NO_TOOL_HINT}`);
  }
  const [call] = first.last.requires_action.tool_calls;
  console.log(`requires_action: ${call.call_id} ${call.name} ${call.arguments}`);
  // The client runs the tool and sends its result back.
  const output = { function_call_output: { call_id: call.call_id, output: '{"temp": 21}' } };
  const second = await run(client, {
    previous_response_id: first.responseId, input_items: { items: [output] }, tools: [weatherTool],
  });
  if (second.last.event !== 'completed') throw new Error(`expected completed, got ${second.last.event}`);
  console.log(`completed: ${second.text}`);

  try {
    await run(client, { input_text: 'Too hot.', temperature: 5 });
    throw new Error('expected INVALID_ARGUMENT');
  } catch (error) {
    if (!error.metadata) throw error;
    for (const v of badRequestDetails(error)) console.log(`bad_request: ${CODES[error.code]} ${v.field}: ${v.description}`);
  }

  let cancelling = null;
  const story = await run(client, { input_text: 'Tell me a long story.' }, (event, so_far) => {
    if (event.output_text_delta && !cancelling) {
      cancelling = new Promise((resolve, reject) => {
        client.CancelResponse({ response_id: so_far.responseId }, (error) => (error ? reject(error) : resolve()));
      });
    }
  });
  await cancelling;
  console.log(`cancelled: ${story.last.cancelled.response.status}`);

  await new Promise((resolve) => {
    client.GetResponse({ response_id: 'resp_missing' }, (error) => {
      console.log(`get_missing: ${CODES[error.code]}`);
      resolve();
    });
  });
}

module.exports = { converse, structOf };
