package main

// `loadgen -mode backend`: the fake OpenAI-compatible backend of bench/backend.py, in Go, for the
// figures where a Python backend would be the bottleneck (a thousand streams at 10 tokens/s each
// is 10,000 SSE chunks a second). It answers from the model name the same way:
// `bench?words=20&delay=0.02&tools=1&stamp=1` streams `words` text chunks `delay` seconds apart
// (each "<CLOCK_MONOTONIC ns> " when stamped), then, while the conversation holds fewer than
// `tools` tool results, a call of the function noop. Chunks look like vLLM's and OpenAI's.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

type plan struct {
	words int
	delay time.Duration
	tools int
	stamp bool
}

func planOf(model string) plan {
	p := plan{words: 20}
	_, query, _ := strings.Cut(model, "?")
	values, _ := url.ParseQuery(query)
	if v, err := strconv.Atoi(values.Get("words")); err == nil {
		p.words = v
	}
	if v, err := strconv.ParseFloat(values.Get("delay"), 64); err == nil {
		p.delay = time.Duration(v * float64(time.Second))
	}
	if v, err := strconv.Atoi(values.Get("tools")); err == nil {
		p.tools = v
	}
	p.stamp = values.Get("stamp") == "1"
	return p
}

type chatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role string `json:"role"`
	} `json:"messages"`
}

func serveBackend(listen string) {
	listener, err := net.Listen("tcp", listen)
	if err != nil {
		fail(err)
	}
	fmt.Printf("READY %d\n", listener.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	go func() {
		// The parent closes our stdin when it goes: stop with it.
		buf := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				os.Exit(0)
			}
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", chat)
	server := &http.Server{Handler: mux}
	fail(server.Serve(listener))
}

func chat(w http.ResponseWriter, r *http.Request) {
	var request chatRequest
	if err := json.NewDecoder(r.Body).Decode(&request); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	p := planOf(request.Model)
	answered := 0
	for _, m := range request.Messages {
		if m.Role == "tool" {
			answered++
		}
	}
	call := answered < p.tools
	if !request.Stream {
		answer(w, request.Model, p, call, answered)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	head := fmt.Sprintf(`{"id":"chatcmpl-go","object":"chat.completion.chunk","created":%d,"model":%q,"choices":[`,
		time.Now().Unix(), request.Model)
	send := func(choice string) bool {
		_, err := fmt.Fprintf(w, "data: %s%s]}\n\n", head, choice)
		flusher.Flush()
		return err == nil
	}
	if !send(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`) {
		return
	}
	for i := 0; i < p.words; i++ {
		if p.delay > 0 {
			time.Sleep(p.delay)
		}
		word := "word "
		if p.stamp {
			word = strconv.FormatInt(monoNs(), 10) + " "
		}
		if !send(`{"index":0,"delta":{"content":"` + word + `"},"logprobs":null,"finish_reason":null}`) {
			return
		}
	}
	finish := "stop"
	if call {
		arguments, _ := json.Marshal(fmt.Sprintf(`{"round": %d}`, answered))
		send(fmt.Sprintf(`{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_%d_%d","type":"function",`+
			`"function":{"name":"noop","arguments":%s}}]},"logprobs":null,"finish_reason":null}`,
			monoNs(), answered, arguments))
		finish = "tool_calls"
	}
	send(`{"index":0,"delta":{},"logprobs":null,"finish_reason":"` + finish + `"}`)
	fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-go\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+
		"\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", p.words, p.words+7)
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
}

func answer(w http.ResponseWriter, model string, p plan, call bool, answered int) {
	message := map[string]interface{}{"role": "assistant", "content": strings.Repeat("word ", p.words)}
	finish := "stop"
	if call {
		message["tool_calls"] = []interface{}{map[string]interface{}{
			"id": fmt.Sprintf("call_%d_%d", monoNs(), answered), "type": "function",
			"function": map[string]string{"name": "noop", "arguments": fmt.Sprintf(`{"round": %d}`, answered)},
		}}
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]interface{}{
		"id": "chatcmpl-go", "object": "chat.completion", "created": time.Now().Unix(), "model": model,
		"choices": []interface{}{map[string]interface{}{"index": 0, "message": message, "finish_reason": finish}},
		"usage":   map[string]int{"prompt_tokens": 7, "completion_tokens": p.words, "total_tokens": p.words + 7},
	})
}
