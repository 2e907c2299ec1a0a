// The same client without any .proto file: the service's descriptors come from the server's
// reflection service (grpc.reflection.v1alpha):  node examples/node/reflection.js 127.0.0.1:50051
'use strict';

const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');
const { converse, structOf } = require('./conversation');

const OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true };

async function main(target) {
  const credentials = grpc.credentials.createInsecure();
  const reflection = new GrpcReflection(target, credentials);
  const services = await reflection.listServices();
  if (!services.includes('antwort.v1.ResponsesService')) throw new Error(`not served: ${services}`);
  const descriptor = await reflection.getDescriptorBySymbol('antwort.v1.ResponsesService');
  const { ResponsesService } = descriptor.getPackageObject(OPTIONS).antwort.v1;
  const client = new ResponsesService(target, credentials);
  try {
    await converse(client, structOf({ entries: true }));
  } finally {
    client.close();
  }
}

main(process.argv[2] || '127.0.0.1:50051').catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
