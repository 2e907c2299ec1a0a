// A Go client of antwort.v1.ResponsesService, generated from protos/ with their go_package as-is.
// It streams a response with a function tool, answers the requires_action, and prints one line
// per event: "<sequence_number> <event kind> <response status>".
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func stream(client antwortv1.ResponsesServiceClient, req *antwortv1.CreateResponseRequest) (*antwortv1.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events, err := client.CreateResponse(ctx, req)
	if err != nil {
		return nil, err
	}
	var last *antwortv1.Response
	for {
		msg, err := events.Recv()
		if err == io.EOF {
			return last, nil
		}
		if err != nil {
			return nil, err
		}
		ev := msg.GetEvent()
		status := ""
		switch e := ev.GetEvent().(type) {
		case *antwortv1.StreamEvent_Created:
			fmt.Printf("%d created\n", ev.GetSequenceNumber())
		case *antwortv1.StreamEvent_OutputTextDelta:
			fmt.Printf("%d output_text_delta %q\n", ev.GetSequenceNumber(), e.OutputTextDelta.GetDelta())
		case *antwortv1.StreamEvent_RequiresAction:
			last = e.RequiresAction.GetResponse()
			status = last.GetStatus().String()
			fmt.Printf("%d requires_action %s %s\n", ev.GetSequenceNumber(), status, e.RequiresAction.GetToolCalls()[0].GetCallId())
		case *antwortv1.StreamEvent_Completed:
			last = e.Completed.GetResponse()
			fmt.Printf("%d completed %s\n", ev.GetSequenceNumber(), last.GetStatus().String())
		default:
			fmt.Printf("%d other\n", ev.GetSequenceNumber())
		}
	}
}

func main() {
	conn, err := grpc.Dial(os.Args[1], grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(10*time.Second))
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := antwortv1.NewResponsesServiceClient(conn)
	params, _ := structpb.NewStruct(map[string]interface{}{
		"type": "object", "properties": map[string]interface{}{"city": map[string]interface{}{"type": "string"}},
	})
	tool := &antwortv1.Tool{Kind: &antwortv1.Tool_Function{Function: &antwortv1.FunctionTool{Name: "get_weather", Parameters: params}}}
	first, err := stream(client, &antwortv1.CreateResponseRequest{
		Input:  &antwortv1.CreateResponseRequest_InputText{InputText: "Weather in Paris?"},
		Tools:  []*antwortv1.Tool{tool},
		Stream: true,
	})
	if err != nil {
		fmt.Println("create:", err)
		os.Exit(1)
	}
	callID := first.GetOutput()[0].GetFunctionCall().GetCallId()
	output := &antwortv1.Item{Kind: &antwortv1.Item_FunctionCallOutput{FunctionCallOutput: &antwortv1.FunctionCallOutput{CallId: callID, Output: `{"temp": 21}`}}}
	_, err = stream(client, &antwortv1.CreateResponseRequest{
		PreviousResponseId: first.GetId(),
		Input:              &antwortv1.CreateResponseRequest_InputItems{InputItems: &antwortv1.ItemList{Items: []*antwortv1.Item{output}}},
		Tools:              []*antwortv1.Tool{tool},
		Stream:             true,
	})
	if err != nil {
		fmt.Println("continue:", err)
		os.Exit(1)
	}
	_, err = client.GetResponse(context.Background(), &antwortv1.GetResponseRequest{ResponseId: "resp_missing"})
	fmt.Println("get missing:", status.Code(err), err)
}
