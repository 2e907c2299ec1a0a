// A Node client of antwort.v1.ResponsesService with @grpc/grpc-js and @grpc/proto-loader, loading
// the .proto files of this repository:  node examples/node/client.js 127.0.0.1:50051
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { converse, structOf } = require('./conversation');

const PROTOS = path.join(__dirname, '..', '..', 'protos');
// keepCase: fields as in the .proto (snake_case); oneofs: a oneof's name says which field is set;
// enums as their names. Struct, Timestamp and friends come with proto-loader.
const OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true, includeDirs: [PROTOS] };

async function main(target) {
  const definition = protoLoader.loadSync('antwort/v1/responses_service.proto', OPTIONS);
  const { ResponsesService } = grpc.loadPackageDefinition(definition).antwort.v1;
  const client = new ResponsesService(target, grpc.credentials.createInsecure());
  try {
    await converse(client, structOf({ entries: false }));
  } finally {
    client.close();
  }
}

main(process.argv[2] || '127.0.0.1:50051').catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
