package main

// A bidirectional session (Converse): start a response, steer it while it streams, approve the
// tool call it then makes, answer the call, and read the interactive events on the way.

import (
	"context"
	"fmt"
	"strings"
	"time"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
)

func userText(text string) *antwortv1.Item {
	part := &antwortv1.ContentPart{Part: &antwortv1.ContentPart_InputText{InputText: &antwortv1.InputText{Text: text}}}
	return &antwortv1.Item{Kind: &antwortv1.Item_Message{Message: &antwortv1.Message{
		Role: antwortv1.Role_ROLE_USER, Content: []*antwortv1.ContentPart{part},
	}}}
}

func control(c *antwortv1.Control) *antwortv1.ConverseRequest {
	return &antwortv1.ConverseRequest{Message: &antwortv1.ConverseRequest_Control{Control: c}}
}

func converse(client antwortv1.ResponsesServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	session, err := client.Converse(ctx)
	if err != nil {
		return err
	}
	tool := weatherTool()
	tool.RequireApproval = &antwortv1.RequireApproval{Mode: antwortv1.ApprovalMode_APPROVAL_MODE_ALWAYS}
	create := &antwortv1.CreateResponseRequest{
		Input:       &antwortv1.CreateResponseRequest_InputText{InputText: "Tell me a long story."},
		Tools:       []*antwortv1.Tool{tool},
		BatchEvents: true,
	}
	if err := session.Send(&antwortv1.ConverseRequest{Message: &antwortv1.ConverseRequest_Create{Create: create}}); err != nil {
		return err
	}
	var kinds []string
	steered := false
	for {
		msg, err := session.Recv()
		if err != nil {
			return err
		}
		if rejected := msg.GetRejected(); rejected != nil {
			return fmt.Errorf("control rejected: %s", rejected.GetMessage())
		}
		for _, ev := range eventsOf(msg.GetEvents(), msg.GetEvent()) {
			kinds = append(kinds, kind(ev))
			switch {
			case ev.GetOutputTextDelta() != nil && !steered:
				// Typed while the answer streams: the model's stream is stopped, the next turn starts with it.
				steered = true
				steer := &antwortv1.SteerControl{Items: []*antwortv1.Item{userText("Make it short, and check the weather.")}}
				if err := session.Send(control(&antwortv1.Control{Control: &antwortv1.Control_Steer{Steer: steer}})); err != nil {
					return err
				}
			case ev.GetInputInjected() != nil:
				text := ev.GetInputInjected().GetItems()[0].GetMessage().GetContent()[0].GetInputText().GetText()
				fmt.Println("converse_steered:", text)
			case ev.GetApprovalRequested() != nil:
				for _, request := range ev.GetApprovalRequested().GetRequests() {
					fmt.Println("converse_approval:", request.GetCallId(), request.GetName(), request.GetArguments())
					decision := &antwortv1.ApprovalResponse{CallId: request.GetCallId(), Approve: true}
					if err := session.Send(control(&antwortv1.Control{Control: &antwortv1.Control_Approval{Approval: decision}})); err != nil {
						return err
					}
				}
			case ev.GetRequiresAction() != nil:
				// The approved call is the client's to run: answer it on the same stream.
				action := ev.GetRequiresAction()
				call := action.GetToolCalls()[0]
				fmt.Println("converse_requires_action:", call.GetCallId())
				result := &antwortv1.Item{Kind: &antwortv1.Item_FunctionCallOutput{FunctionCallOutput: &antwortv1.FunctionCallOutput{
					CallId: call.GetCallId(), Output: `{"temp": 21}`,
				}}}
				next := &antwortv1.CreateResponseRequest{
					PreviousResponseId: action.GetResponse().GetId(),
					Input:              &antwortv1.CreateResponseRequest_InputItems{InputItems: &antwortv1.ItemList{Items: []*antwortv1.Item{result}}},
					Tools:              []*antwortv1.Tool{tool},
					BatchEvents:        true,
				}
				if err := session.Send(&antwortv1.ConverseRequest{Message: &antwortv1.ConverseRequest_Create{Create: next}}); err != nil {
					return err
				}
			case ev.GetCompleted() != nil:
				var text strings.Builder
				for _, item := range ev.GetCompleted().GetResponse().GetOutput() {
					for _, part := range item.GetMessage().GetContent() {
						text.WriteString(part.GetOutputText().GetText())
					}
				}
				fmt.Println("converse:", strings.Join(kinds, " "))
				fmt.Println("converse_completed:", text.String())
				return session.CloseSend()
			}
		}
	}
}
