package main

// The connection settings docs/clients.md recommends for Go clients of the gateway.

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// serviceConfig spreads calls over every address the target resolves to (a headless Service:
// dns:///antwort-gateway-headless:50051) and retries the calls that are safe to repeat when the
// gateway could not be reached. CreateResponse, Converse and ControlResponse are not retried: a
// second attempt could start a second response or apply a steer twice. grpc-go before 1.40 retries
// only with GRPC_GO_RETRY=on in the environment.
const serviceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [
      {"service": "antwort.v1.ResponsesService", "method": "GetResponse"},
      {"service": "antwort.v1.ResponsesService", "method": "ListInputItems"},
      {"service": "antwort.v1.ResponsesService", "method": "CancelResponse"},
      {"service": "grpc.health.v1.Health", "method": "Check"}
    ],
    "timeout": "10s",
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.2s",
      "maxBackoff": "2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// dialOptions: keepalive pings every 10 s (also while a stream waits idle for an approval), a
// dead connection noticed 20 s later, and the service config above.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                10 * time.Second,
			Timeout:             20 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.WithDefaultServiceConfig(serviceConfig),
	}
}
