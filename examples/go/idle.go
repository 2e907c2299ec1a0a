package main

// A Converse session that waits: the model asks to call a tool that needs an approval, and the
// client takes its time (a person deciding) before it approves. With keepalive pings every 10 s
// the connection must carry the idle stream all that while.

import (
	"context"
	"fmt"
	"time"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
	"google.golang.org/grpc/status"
)

func holdIdle(client antwortv1.ResponsesServiceClient, wait time.Duration) error {
	// The session's deadline covers the wait: a deadline is what ends a stream nobody needs.
	ctx, cancel := context.WithTimeout(context.Background(), wait+60*time.Second)
	defer cancel()
	session, err := client.Converse(ctx)
	if err != nil {
		return err
	}
	tool := weatherTool()
	tool.RequireApproval = &antwortv1.RequireApproval{Mode: antwortv1.ApprovalMode_APPROVAL_MODE_ALWAYS}
	create := &antwortv1.CreateResponseRequest{
		Input: &antwortv1.CreateResponseRequest_InputText{InputText: "Weather in Paris?"},
		Tools: []*antwortv1.Tool{tool},
	}
	if err := session.Send(&antwortv1.ConverseRequest{Message: &antwortv1.ConverseRequest_Create{Create: create}}); err != nil {
		return err
	}
	for {
		msg, err := session.Recv()
		if err != nil {
			return fmt.Errorf("stream ended: %v", status.Convert(err).Message())
		}
		ev := msg.GetEvent()
		if approval := ev.GetApprovalRequested(); approval != nil {
			started := time.Now()
			time.Sleep(wait)
			fmt.Printf("idle_waited: %.0fs\n", time.Since(started).Seconds())
			for _, request := range approval.GetRequests() {
				decision := &antwortv1.ApprovalResponse{CallId: request.GetCallId(), Approve: true}
				if err := session.Send(control(&antwortv1.Control{Control: &antwortv1.Control_Approval{Approval: decision}})); err != nil {
					// A closed stream's Send says only EOF; its status comes with the next Recv.
					_, err = session.Recv()
					return fmt.Errorf("stream ended during the wait: %v", status.Convert(err).Message())
				}
			}
		}
		if action := ev.GetRequiresAction(); action != nil {
			fmt.Println("idle_requires_action:", action.GetToolCalls()[0].GetCallId())
			if err := session.CloseSend(); err != nil {
				return err
			}
			// A new call after the wait works too (on a new connection if the old one was aged out).
			got, err := client.GetResponse(context.Background(), &antwortv1.GetResponseRequest{ResponseId: action.GetResponse().GetId()})
			if err != nil {
				return err
			}
			fmt.Println("idle_get:", got.GetResponse().GetStatus().String())
			return nil
		}
	}
}
