// A Go client of antwort.v1.ResponsesService: code generated from protos/ with their go_package,
// built with Debian's Go toolchain and grpc-go (see README, "Clients in Go, Java and Node").
//
// It holds one conversation and prints a transcript line per step: a streamed answer, a function
// tool round trip (requires_action, then the result sent back with previous_response_id), the
// google.rpc.BadRequest details of an INVALID_ARGUMENT, CancelResponse on a running answer, and a
// bidirectional Converse session (converse.go): steer, approve, answer the call; and a background
// response whose stream it drops and re-attaches to (reattach.go).
//
//	go-client 127.0.0.1:50051
//	go-client -hold-idle 60s 127.0.0.1:50051   (only: an idle Converse stream held at an approval)
//
// It dials with the settings docs/clients.md recommends (dial.go): keepalive, retries, round_robin.
//
// The gateway must run a model that calls tools: `make run-tools` (a scripted stand-in model) does;
// the embedded model of `make run` does not.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// kind is the name of the event's oneof field: "created", "output_text_delta", …
func kind(ev *antwortv1.StreamEvent) string {
	m := ev.ProtoReflect()
	field := m.WhichOneof(m.Descriptor().Oneofs().ByName("event"))
	if field == nil {
		return "unknown"
	}
	return string(field.Name())
}

// terminal is the Response carried by a terminal event, or nil.
func terminal(ev *antwortv1.StreamEvent) *antwortv1.Response {
	switch e := ev.GetEvent().(type) {
	case *antwortv1.StreamEvent_Completed:
		return e.Completed.GetResponse()
	case *antwortv1.StreamEvent_RequiresAction:
		return e.RequiresAction.GetResponse()
	case *antwortv1.StreamEvent_Incomplete:
		return e.Incomplete.GetResponse()
	case *antwortv1.StreamEvent_Failed:
		return e.Failed.GetResponse()
	case *antwortv1.StreamEvent_Cancelled:
		return e.Cancelled.GetResponse()
	}
	return nil
}

// messagesRead counts the stream messages run has read (a batch of events is one message).
var messagesRead int

// run streams one response; onEvent sees every event. It returns the event kinds, the text and
// the terminal event.
func run(client antwortv1.ResponsesServiceClient, req *antwortv1.CreateResponseRequest, onEvent func(*antwortv1.StreamEvent)) ([]string, string, *antwortv1.StreamEvent, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req.Stream = true
	// Events the gateway produces together (created and in_progress, the done events and the
	// terminal one) come in one message: fewer messages for both sides. The events are the same.
	req.BatchEvents = true
	events, err := client.CreateResponse(ctx, req)
	if err != nil {
		return nil, "", nil, err
	}
	var kinds []string
	var text strings.Builder
	var last *antwortv1.StreamEvent
	for {
		msg, err := events.Recv()
		if err == io.EOF {
			return kinds, text.String(), last, nil
		}
		if err != nil {
			return kinds, text.String(), last, err
		}
		messagesRead++
		for _, ev := range eventsOf(msg.GetEvents(), msg.GetEvent()) {
			kinds = append(kinds, kind(ev))
			if delta := ev.GetOutputTextDelta(); delta != nil {
				text.WriteString(delta.GetDelta())
			}
			if terminal(ev) != nil {
				last = ev
			}
			if onEvent != nil {
				onEvent(ev)
			}
		}
	}
}

// eventsOf is the events one message carries: a batch (the request asked for batch_events and
// they left together) or the one event.
func eventsOf(batch []*antwortv1.StreamEvent, one *antwortv1.StreamEvent) []*antwortv1.StreamEvent {
	if len(batch) > 0 {
		return batch
	}
	if one == nil {
		return nil
	}
	return []*antwortv1.StreamEvent{one}
}

func weatherTool() *antwortv1.Tool {
	// google.protobuf.Struct from a plain Go map: the JSON Schema of the arguments.
	params, err := structpb.NewStruct(map[string]interface{}{
		"type":       "object",
		"properties": map[string]interface{}{"city": map[string]interface{}{"type": "string"}},
		"required":   []interface{}{"city"},
	})
	if err != nil {
		panic(err)
	}
	return &antwortv1.Tool{Kind: &antwortv1.Tool_Function{Function: &antwortv1.FunctionTool{Name: "get_weather", Parameters: params}}}
}

func streamText(client antwortv1.ResponsesServiceClient) error {
	messagesRead = 0
	kinds, text, _, err := run(client, &antwortv1.CreateResponseRequest{
		Input: &antwortv1.CreateResponseRequest_InputText{InputText: "Say hello in French."},
	}, nil)
	if err != nil {
		return err
	}
	fmt.Println("stream:", strings.Join(kinds, " "))
	fmt.Println("stream_messages:", messagesRead)
	fmt.Println("text:", text)
	return nil
}

// What to do when the model answers instead of calling the tool.
const noToolHint = "the model called no tool: start the gateway with `make run-tools` (the embedded model of `make run` calls none)"

func toolRoundTrip(client antwortv1.ResponsesServiceClient) error {
	tool := weatherTool()
	_, _, last, err := run(client, &antwortv1.CreateResponseRequest{
		Input: &antwortv1.CreateResponseRequest_InputText{InputText: "Weather in Paris?"},
		Tools: []*antwortv1.Tool{tool},
	}, nil)
	if err != nil {
		return err
	}
	action := last.GetRequiresAction()
	if action == nil {
		return fmt.Errorf("expected requires_action, got %s: %s", kind(last), noToolHint)
	}
	call := action.GetToolCalls()[0]
	fmt.Println("requires_action:", call.GetCallId(), call.GetName(), call.GetArguments())
	// The client runs the tool and sends its result back.
	result := &antwortv1.Item{Kind: &antwortv1.Item_FunctionCallOutput{FunctionCallOutput: &antwortv1.FunctionCallOutput{
		CallId: call.GetCallId(), Output: `{"temp": 21}`,
	}}}
	_, text, last, err := run(client, &antwortv1.CreateResponseRequest{
		PreviousResponseId: action.GetResponse().GetId(),
		Input:              &antwortv1.CreateResponseRequest_InputItems{InputItems: &antwortv1.ItemList{Items: []*antwortv1.Item{result}}},
		Tools:              []*antwortv1.Tool{tool},
	}, nil)
	if err != nil {
		return err
	}
	if last.GetCompleted() == nil {
		return fmt.Errorf("expected completed, got %s", kind(last))
	}
	fmt.Println("completed:", text)
	return nil
}

// codeName spells status codes the way google.rpc.Code does.
var codeName = map[codes.Code]string{codes.InvalidArgument: "INVALID_ARGUMENT", codes.NotFound: "NOT_FOUND"}

func badRequest(client antwortv1.ResponsesServiceClient) error {
	temperature := 5.0
	_, _, _, err := run(client, &antwortv1.CreateResponseRequest{
		Input:       &antwortv1.CreateResponseRequest_InputText{InputText: "Too hot."},
		Temperature: &temperature,
	}, nil)
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return fmt.Errorf("expected a gRPC error, got %v", err)
	}
	for _, detail := range st.Details() {
		if bad, isBad := detail.(*errdetails.BadRequest); isBad {
			for _, v := range bad.GetFieldViolations() {
				fmt.Printf("bad_request: %s %s: %s\n", codeName[st.Code()], v.GetField(), v.GetDescription())
			}
			return nil
		}
	}
	return fmt.Errorf("no BadRequest detail in %v", st.Details())
}

func cancelRunning(client antwortv1.ResponsesServiceClient) error {
	var responseID string
	cancelled := false
	var cancelErr error
	_, _, last, err := run(client, &antwortv1.CreateResponseRequest{
		Input: &antwortv1.CreateResponseRequest_InputText{InputText: "Tell me a long story."},
	}, func(ev *antwortv1.StreamEvent) {
		if created := ev.GetCreated(); created != nil {
			responseID = created.GetResponse().GetId()
		}
		if ev.GetOutputTextDelta() != nil && !cancelled {
			cancelled = true
			_, cancelErr = client.CancelResponse(context.Background(), &antwortv1.CancelResponseRequest{ResponseId: responseID})
		}
	})
	if err != nil {
		return err
	}
	if cancelErr != nil {
		return cancelErr
	}
	fmt.Println("cancelled:", terminal(last).GetStatus().String())
	return nil
}

func main() {
	holdIdleFor := flag.Duration("hold-idle", 0, "only hold a Converse stream idle this long at an approval, then finish it")
	flag.Parse()
	options := append(dialOptions(), grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(10*time.Second))
	conn, err := grpc.Dial(flag.Arg(0), options...)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := antwortv1.NewResponsesServiceClient(conn)
	if *holdIdleFor > 0 {
		if err := holdIdle(client, *holdIdleFor); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		return
	}
	steps := []func(antwortv1.ResponsesServiceClient) error{streamText, toolRoundTrip, badRequest, cancelRunning, converse, reattach}
	for _, step := range steps {
		if err := step(client); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	// NOT_FOUND names what it did not find: google.rpc.ResourceInfo.
	_, err = client.GetResponse(context.Background(), &antwortv1.GetResponseRequest{ResponseId: "resp_missing"})
	missing := ""
	for _, detail := range status.Convert(err).Details() {
		if info, ok := detail.(*errdetails.ResourceInfo); ok {
			missing = " " + info.GetResourceType() + " " + info.GetResourceName()
		}
	}
	fmt.Println("get_missing:", codeName[status.Code(err)]+missing)
}
