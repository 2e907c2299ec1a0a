// A load generator for the benchmarks whose own CPU per event is far below the gateway's: Go,
// grpc-go, code generated from protos/ (built offline with Debian's toolchain by build.sh).
//
//	loadgen -mode stream -target 127.0.0.1:50051 -model M -n 1000 -c 1000 [-tools] [-stamped]
//	loadgen -mode create -target 127.0.0.1:50051 -model M -n 1000 -c 32
//	loadgen -mode http -url http://127.0.0.1:8000/v1/chat/completions -body FILE -n 1000 -c 32
//	loadgen -mode backend      # a fake OpenAI-compatible backend (backend.go); prints READY <port>
//
// It prints one JSON object: what it did, its own CPU seconds, and the samples the Python bench
// turns into figures. Times are CLOCK_MONOTONIC seconds, the clock of Python's perf_counter, so
// they compare with the bench's own. With -stamped, each text delta carries the moments the
// backend wrote its tokens ("<ns> " per token; a merged delta carries several).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	antwortv1 "github.com/antwort-grpc/antwort-grpc/gen/go/antwort/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// monoNs is CLOCK_MONOTONIC in nanoseconds (Go's time package does not expose its raw value).
func monoNs() int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

type streamResult struct {
	FirstText float64 `json:"first_text"`
	Ended     float64 `json:"ended"`
	Terminal  string  `json:"terminal"`
	OK        bool    `json:"sequence_ok"`
	Events    int     `json:"events"`
	Deltas    int     `json:"deltas"`
	Tokens    int     `json:"tokens"`
	Error     string  `json:"error,omitempty"`
}

type report struct {
	Mode          string         `json:"mode"`
	Requests      int            `json:"requests"`
	Errors        int            `json:"errors"`
	Events        int            `json:"events"`
	Deltas        int            `json:"deltas"`
	Tokens        int            `json:"tokens"`
	CPUSeconds    float64        `json:"cpu_s"`
	Started       float64        `json:"started"`
	WallSeconds   float64        `json:"wall_s"`
	Latencies     []float64      `json:"latencies_s"`
	Streams       []streamResult `json:"streams,omitempty"`
	LagsNs        []int64        `json:"lags_ns,omitempty"`
	LagTimes      []float64      `json:"lag_times,omitempty"`
	PeakOpen      int64          `json:"peak_open"`
	PeakStreaming int64          `json:"peak_streaming"`
}

func main() {
	mode := flag.String("mode", "stream", "stream | create | http | backend")
	target := flag.String("target", "127.0.0.1:50051", "the gateway (stream, create)")
	url := flag.String("url", "", "the backend's chat completions URL (http)")
	bodyFile := flag.String("body", "", "the JSON body to POST (http)")
	model := flag.String("model", "", "the request's model")
	input := flag.String("input", "hi", "the request's input_text")
	n := flag.Int("n", 1, "requests in all")
	c := flag.Int("c", 1, "requests at once")
	channels := flag.Int("channels", 8, "gRPC connections (streams are spread over them)")
	tools := flag.Bool("tools", false, "offer the function tool noop")
	stamped := flag.Bool("stamped", false, "text deltas carry the backend's write times")
	noCoalesce := flag.Bool("no-coalesce", false, "ask for one delta event per backend chunk")
	batch := flag.Bool("batch", false, "ask for batched events (events produced together in one message)")
	listen := flag.String("listen", "127.0.0.1:0", "where the backend listens (backend)")
	cpuProfile := flag.String("cpuprofile", "", "write a pprof CPU profile of the load generator here")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *mode == "backend" {
		serveBackend(*listen)
		return
	}

	request := &antwortv1.CreateResponseRequest{
		Model: *model, Input: &antwortv1.CreateResponseRequest_InputText{InputText: *input},
		Stream: *mode == "stream",
	}
	if *tools {
		parameters, _ := structpb.NewStruct(map[string]interface{}{"type": "object", "properties": map[string]interface{}{}})
		request.Tools = []*antwortv1.Tool{{Kind: &antwortv1.Tool_Function{Function: &antwortv1.FunctionTool{
			Name: "noop", Description: "the noop tool", Parameters: parameters}}}}
	}
	request.BatchEvents = *batch
	if *noCoalesce {
		request.DeltaCoalescing = &antwortv1.DeltaCoalescing{Disabled: true}
	}

	var call func(worker int, r *report, mu *sync.Mutex) error
	var open, streaming int64
	switch *mode {
	case "stream", "create":
		conns := make([]antwortv1.ResponsesServiceClient, *channels)
		for i := range conns {
			// Large fixed windows: no BDP pings, few window updates (each one a write and a wake-up).
			conn, err := grpc.Dial(*target, grpc.WithInsecure(), grpc.WithInitialWindowSize(1<<24),
				grpc.WithInitialConnWindowSize(1<<24), grpc.WithReadBufferSize(1<<18))
			if err != nil {
				fail(err)
			}
			defer conn.Close()
			conns[i] = antwortv1.NewResponsesServiceClient(conn)
		}
		call = func(worker int, r *report, mu *sync.Mutex) error {
			return stream(conns[worker%len(conns)], request, *stamped, r, mu, &open, &streaming)
		}
	case "http":
		body, err := os.ReadFile(*bodyFile)
		if err != nil {
			fail(err)
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *c, MaxConnsPerHost: 0}}
		call = func(worker int, r *report, mu *sync.Mutex) error {
			response, err := client.Post(*url, "application/json", bytes.NewReader(body))
			if err != nil {
				return err
			}
			defer response.Body.Close()
			if _, err := io.Copy(io.Discard, response.Body); err != nil {
				return err
			}
			if response.StatusCode != 200 {
				return fmt.Errorf("HTTP %d", response.StatusCode)
			}
			return nil
		}
	default:
		fail(fmt.Errorf("unknown mode %q", *mode))
	}

	r := &report{Mode: *mode, Requests: *n}
	var mu sync.Mutex
	var remaining int64 = int64(*n)
	cpu0 := cpuSeconds()
	started := monoNs()
	var wg sync.WaitGroup
	for w := 0; w < *c; w++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			for atomic.AddInt64(&remaining, -1) >= 0 {
				t0 := monoNs()
				err := call(worker, r, &mu)
				elapsed := seconds(monoNs() - t0)
				mu.Lock()
				r.Latencies = append(r.Latencies, elapsed)
				if err != nil {
					r.Errors++
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	r.Started = seconds(started)
	r.WallSeconds = seconds(monoNs() - started)
	r.CPUSeconds = cpuSeconds() - cpu0
	r.PeakOpen = atomic.LoadInt64(&peakOpen)
	r.PeakStreaming = atomic.LoadInt64(&peakStreaming)
	out, _ := json.Marshal(r)
	os.Stdout.Write(append(out, '\n'))
}

var peakOpen, peakStreaming int64

func raise(counter *int64, peak *int64) {
	now := atomic.AddInt64(counter, 1)
	for {
		old := atomic.LoadInt64(peak)
		if now <= old || atomic.CompareAndSwapInt64(peak, old, now) {
			return
		}
	}
}

func stream(client antwortv1.ResponsesServiceClient, request *antwortv1.CreateResponseRequest, stamped bool,
	r *report, mu *sync.Mutex, open *int64, streaming *int64) error {
	raise(open, &peakOpen)
	defer atomic.AddInt64(open, -1)
	res := streamResult{OK: true}
	var lags []int64
	var lagTimes []float64
	counted := false
	defer func() {
		if counted {
			atomic.AddInt64(streaming, -1)
		}
	}()
	events, err := client.CreateResponse(context.Background(), request)
	for err == nil {
		var message *antwortv1.CreateResponseResponse
		message, err = events.Recv()
		if err != nil {
			break
		}
		now := monoNs()
		batch := message.GetEvents()
		if len(batch) == 0 {
			batch = []*antwortv1.StreamEvent{message.GetEvent()}
		}
		for _, ev := range batch {
			lags, lagTimes = readEvent(ev, now, request, stamped, &res, lags, lagTimes, streaming, &counted)
		}
	}
	res.Ended = seconds(monoNs())
	if err == io.EOF {
		err = nil
	}
	if err != nil {
		res.Error = err.Error()
	} else if res.Terminal != "completed" {
		err = fmt.Errorf("the response ended %q", res.Terminal)
	}
	mu.Lock()
	r.Events += res.Events
	r.Deltas += res.Deltas
	r.Tokens += res.Tokens
	if request.Stream {
		r.Streams = append(r.Streams, res)
		r.LagsNs = append(r.LagsNs, lags...)
		r.LagTimes = append(r.LagTimes, lagTimes...)
	}
	mu.Unlock()
	return err
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(1)
}

// readEvent takes one event of a stream into its result (sequence, deltas, tokens and their lags,
// the terminal kind).
func readEvent(ev *antwortv1.StreamEvent, now int64, request *antwortv1.CreateResponseRequest, stamped bool,
	res *streamResult, lags []int64, lagTimes []float64, streaming *int64, counted *bool) ([]int64, []float64) {
	res.Events++
	if int(ev.GetSequenceNumber()) != res.Events {
		res.OK = false
	}
	switch e := ev.GetEvent().(type) {
	case *antwortv1.StreamEvent_OutputTextDelta:
		res.Deltas++
		if res.FirstText == 0 {
			res.FirstText = seconds(now)
			if request.Stream {
				raise(streaming, &peakStreaming)
				*counted = true
			}
		}
		text := e.OutputTextDelta.GetDelta()
		if stamped {
			for _, token := range strings.Fields(text) {
				if stamp, perr := strconv.ParseInt(token, 10, 64); perr == nil {
					lags = append(lags, now-stamp)
					lagTimes = append(lagTimes, seconds(now))
					res.Tokens++
				}
			}
		} else {
			res.Tokens++
		}
	case *antwortv1.StreamEvent_Completed:
		res.Terminal = "completed"
	case *antwortv1.StreamEvent_Incomplete:
		res.Terminal = "incomplete"
	case *antwortv1.StreamEvent_Failed:
		res.Terminal = "failed"
	case *antwortv1.StreamEvent_Cancelled:
		res.Terminal = "cancelled"
	case *antwortv1.StreamEvent_RequiresAction:
		res.Terminal = "requires_action"
	}
	return lags, lagTimes
}
