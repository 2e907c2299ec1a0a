package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
)

// reattach starts a background response, drops its stream after a few events (a network blip, a
// restarted pod), and reads on with AttachResponse from the last sequence number it had: every
// later event exactly once, to the terminal one. The run went on meanwhile; it may even have moved
// to another replica (docs/durable-runs.md).
func reattach(client antwortv1.ResponsesServiceClient) error {
	ctx, drop := context.WithTimeout(context.Background(), 30*time.Second)
	stream, err := client.CreateResponse(ctx, &antwortv1.CreateResponseRequest{
		Input:      &antwortv1.CreateResponseRequest_InputText{InputText: "Tell me a long story."},
		Stream:     true,
		Background: true,
	})
	if err != nil {
		drop()
		return err
	}
	var id string
	var last int32
	var text strings.Builder
	for last < 5 {
		msg, err := stream.Recv()
		if err != nil {
			drop()
			return err
		}
		ev := msg.GetEvent()
		if created := ev.GetCreated(); created != nil {
			id = created.GetResponse().GetId()
		}
		if delta := ev.GetOutputTextDelta(); delta != nil {
			text.WriteString(delta.GetDelta())
		}
		last = ev.GetSequenceNumber()
	}
	drop() // the stream is gone; the background run is not
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The events the log gives back together (the replay, a turn's flush) in one message each.
	attached, err := client.AttachResponse(ctx, &antwortv1.AttachResponseRequest{ResponseId: id, StartingAfter: last, BatchEvents: true})
	if err != nil {
		return err
	}
	next := last + 1
	var end *antwortv1.StreamEvent
	for {
		msg, err := attached.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		for _, ev := range eventsOf(msg.GetEvents(), msg.GetEvent()) {
			if ev.GetSequenceNumber() != next {
				return fmt.Errorf("attach: sequence number %d, expected %d", ev.GetSequenceNumber(), next)
			}
			next++
			if delta := ev.GetOutputTextDelta(); delta != nil {
				text.WriteString(delta.GetDelta())
			}
			if terminal(ev) != nil {
				end = ev
			}
		}
	}
	if end == nil {
		return fmt.Errorf("attach: the stream ended without a terminal event")
	}
	fmt.Println("reattached:", last, kind(end), text.String())
	return nil
}
