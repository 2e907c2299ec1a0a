// A Java client of antwort.v1.ResponsesService: code generated from protos/ (java_package
// io.github.antwort.v1), built with javac against Debian's grpc-java jars (see README, "Clients in
// Go, Java and Node"; examples/java/build.sh).
//
// It holds one conversation and prints a transcript line per step: a streamed answer, a function
// tool round trip (requires_action, then the result sent back with previous_response_id), the
// google.rpc.BadRequest details of an INVALID_ARGUMENT, and CancelResponse on a running answer.
//
//   java -cp "$CLASSPATH" AntwortClient 127.0.0.1:50051
//
// The gateway must run a model that calls tools: `make run-tools` (a scripted stand-in model) does;
// the embedded model of `make run` does not.

import com.google.gson.Gson;
import com.google.protobuf.Struct;
import com.google.protobuf.util.JsonFormat;
import com.google.rpc.BadRequest;
import io.github.antwort.v1.CancelResponseRequest;
import io.github.antwort.v1.CreateResponseRequest;
import io.github.antwort.v1.CreateResponseResponse;
import io.github.antwort.v1.FunctionCall;
import io.github.antwort.v1.FunctionCallOutput;
import io.github.antwort.v1.FunctionTool;
import io.github.antwort.v1.GetResponseRequest;
import io.github.antwort.v1.Item;
import io.github.antwort.v1.ItemList;
import io.github.antwort.v1.Response;
import io.github.antwort.v1.ResponsesServiceGrpc;
import io.github.antwort.v1.StreamEvent;
import io.github.antwort.v1.Tool;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

public final class AntwortClient {
  private final ResponsesServiceGrpc.ResponsesServiceBlockingStub stub;

  private AntwortClient(ResponsesServiceGrpc.ResponsesServiceBlockingStub stub) {
    this.stub = stub;
  }

  /** One streamed response: the event kinds, the text, and the terminal event. */
  private static final class Run {
    final List<String> kinds = new ArrayList<>();
    final StringBuilder text = new StringBuilder();
    StreamEvent last;
    String responseId = "";
  }

  private static Response terminal(StreamEvent event) {
    switch (event.getEventCase()) {
      case COMPLETED: return event.getCompleted().getResponse();
      case REQUIRES_ACTION: return event.getRequiresAction().getResponse();
      case INCOMPLETE: return event.getIncomplete().getResponse();
      case FAILED: return event.getFailed().getResponse();
      case CANCELLED: return event.getCancelled().getResponse();
      default: return null;
    }
  }

  /** Streams a response; cancelAtFirstDelta calls CancelResponse once text starts arriving. */
  private Run run(CreateResponseRequest request, boolean cancelAtFirstDelta) {
    Run run = new Run();
    Iterator<CreateResponseResponse> events =
        stub.withDeadlineAfter(30, TimeUnit.SECONDS).createResponse(request.toBuilder().setStream(true).build());
    boolean cancelled = false;
    while (events.hasNext()) {
      StreamEvent event = events.next().getEvent();
      run.kinds.add(event.getEventCase().name().toLowerCase());
      if (event.hasCreated()) {
        run.responseId = event.getCreated().getResponse().getId();
      }
      if (event.hasOutputTextDelta()) {
        run.text.append(event.getOutputTextDelta().getDelta());
        if (cancelAtFirstDelta && !cancelled) {
          cancelled = true;
          stub.cancelResponse(CancelResponseRequest.newBuilder().setResponseId(run.responseId).build());
        }
      }
      if (terminal(event) != null) {
        run.last = event;
      }
    }
    return run;
  }

  private static Tool weatherTool() throws Exception {
    // google.protobuf.Struct from JSON text: the JSON Schema of the arguments.
    Struct.Builder parameters = Struct.newBuilder();
    JsonFormat.parser().merge(
        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}",
        parameters);
    FunctionTool function = FunctionTool.newBuilder().setName("get_weather").setParameters(parameters).build();
    return Tool.newBuilder().setFunction(function).build();
  }

  private void streamText() {
    Run run = run(CreateResponseRequest.newBuilder().setInputText("Say hello in French.").build(), false);
    System.out.println("stream: " + String.join(" ", run.kinds));
    System.out.println("text: " + run.text);
  }

  /** What to do when the model answers instead of calling the tool. */
  private static final String NO_TOOL_HINT =
      "the model called no tool: start the gateway with `make run-tools` (the embedded model of `make run` calls none)";

  private void toolRoundTrip() throws Exception {
    Tool tool = weatherTool();
    Run first = run(CreateResponseRequest.newBuilder().setInputText("Weather in Paris?").addTools(tool).build(), false);
    if (!first.last.hasRequiresAction()) {
      throw new IllegalStateException("expected requires_action, got " + first.last.getEventCase() + ": " + NO_TOOL_HINT);
    }
    FunctionCall call = first.last.getRequiresAction().getToolCalls(0);
    System.out.println("requires_action: " + call.getCallId() + " " + call.getName() + " " + call.getArguments());
    // The client runs the tool and sends its result back.
    Item result = Item.newBuilder()
        .setFunctionCallOutput(FunctionCallOutput.newBuilder().setCallId(call.getCallId()).setOutput("{\"temp\": 21}"))
        .build();
    Run second = run(CreateResponseRequest.newBuilder()
        .setPreviousResponseId(first.responseId)
        .setInputItems(ItemList.newBuilder().addItems(result))
        .addTools(tool)
        .build(), false);
    if (!second.last.hasCompleted()) {
      throw new IllegalStateException("expected completed, got " + second.last.getEventCase());
    }
    System.out.println("completed: " + second.text);
  }

  private void badRequest() {
    try {
      run(CreateResponseRequest.newBuilder().setInputText("Too hot.").setTemperature(5).build(), false);
      throw new IllegalStateException("expected INVALID_ARGUMENT");
    } catch (StatusRuntimeException error) {
      // The google.rpc.Status in the grpc-status-details-bin trailer, with its typed details.
      com.google.rpc.Status status = StatusProto.fromThrowable(error);
      for (com.google.protobuf.Any detail : status.getDetailsList()) {
        if (detail.is(BadRequest.class)) {
          try {
            for (BadRequest.FieldViolation v : detail.unpack(BadRequest.class).getFieldViolationsList()) {
              System.out.println("bad_request: " + error.getStatus().getCode() + " " + v.getField() + ": " + v.getDescription());
            }
          } catch (com.google.protobuf.InvalidProtocolBufferException e) {
            throw new IllegalStateException(e);
          }
        }
      }
    }
  }

  private void cancelRunning() {
    Run run = run(CreateResponseRequest.newBuilder().setInputText("Tell me a long story.").build(), true);
    System.out.println("cancelled: " + terminal(run.last).getStatus());
  }

  // The settings docs/clients.md recommends: keepalive pings every 10 s (also while a stream waits
  // idle for an approval), a dead connection noticed 20 s later, round_robin over every address
  // the target resolves to (dns:///antwort-gateway-headless:50051), and retries of the calls
  // that are safe to repeat. grpc-java wants the service config as a Map with Double numbers:
  // gson parses JSON into exactly that.
  static final String SERVICE_CONFIG = "{\"methodConfig\": [{"
      + "\"name\": [{\"service\": \"antwort.v1.ResponsesService\", \"method\": \"GetResponse\"},"
      + " {\"service\": \"antwort.v1.ResponsesService\", \"method\": \"ListInputItems\"},"
      + " {\"service\": \"antwort.v1.ResponsesService\", \"method\": \"CancelResponse\"},"
      + " {\"service\": \"grpc.health.v1.Health\", \"method\": \"Check\"}],"
      + " \"timeout\": \"10s\","
      + " \"retryPolicy\": {\"maxAttempts\": 4, \"initialBackoff\": \"0.2s\", \"maxBackoff\": \"2s\","
      + " \"backoffMultiplier\": 2, \"retryableStatusCodes\": [\"UNAVAILABLE\"]}}]}";

  @SuppressWarnings("unchecked")
  static ManagedChannel channel(String target) {
    Map<String, ?> serviceConfig = new Gson().fromJson(SERVICE_CONFIG, Map.class);
    return ManagedChannelBuilder.forTarget(target)
        .usePlaintext()
        .keepAliveTime(10, TimeUnit.SECONDS)
        .keepAliveTimeout(20, TimeUnit.SECONDS)
        .keepAliveWithoutCalls(true)
        .defaultLoadBalancingPolicy("round_robin")
        .defaultServiceConfig(serviceConfig)
        .enableRetry()
        .build();
  }

  public static void main(String[] args) throws Exception {
    ManagedChannel channel = channel(args[0]);
    try {
      AntwortClient client = new AntwortClient(ResponsesServiceGrpc.newBlockingStub(channel));
      client.streamText();
      client.toolRoundTrip();
      client.badRequest();
      client.cancelRunning();
      try {
        client.stub.getResponse(GetResponseRequest.newBuilder().setResponseId("resp_missing").build());
      } catch (StatusRuntimeException error) {
        System.out.println("get_missing: " + error.getStatus().getCode());
      }
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }
}
