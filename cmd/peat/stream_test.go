package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/peatmq/peat/edge"
)

// A stream left out of the configuration stays on disk and is shown as
// unlisted (start log, GET /api/v1/streams); only `peat stream delete`,
// with an admin token, deletes it; a listed stream is refused; a stream
// of the same name listed again later starts empty at offset 0.
func TestStreamDelete_AgainstARunningNode(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	tokens := filepath.Join(dir, "tokens")
	toks := map[string]string{}
	for _, role := range []string{"read", "admin"} {
		var out, errs bytes.Buffer
		if code := token([]string{tokens, "ops-" + role, role}, &out, &errs); code != exitOK {
			t.Fatalf("peat token: %s", errs.String())
		}
		toks[role] = strings.TrimSpace(out.String())
	}
	conf := func(secured bool, streams ...string) string {
		yaml := "streams:\n"
		if secured {
			yaml = "http: {tokens_file: " + tokens + "}\n" + yaml
		}
		for _, s := range streams {
			yaml += "  - {name: " + s + ", filters: [\"" + s + "/#\"]}\n"
		}
		f := filepath.Join(dir, fmt.Sprint(secured, streams)+".yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	p := startPeat(t, data, "--config", conf(false, "old", "live"))
	publishN(t, p.mqttAddr, "old/x", 20)
	publishN(t, p.mqttAddr, "live/x", 3)
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("peat exited %d", code)
	}

	p = startPeat(t, data, "--config", conf(true, "live"))
	if !strings.Contains(p.log(), `"stream":"old"`) || !strings.Contains(p.log(), "stored stream not in the configuration") {
		t.Fatalf("the start log does not name the unlisted stream old:\n%s", p.log())
	}
	streamsAPI := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		resp := httpGetToken(t, "http://"+p.httpAddr+"/api/v1/streams", toks["read"])
		for _, s := range resp {
			out[s.Name] = s.Unlisted
			if s.Name == "old" && s.NextOffset != 20 {
				t.Fatalf("unlisted old shows next_offset %d, want 20", s.NextOffset)
			}
		}
		return out
	}
	if got := streamsAPI(); !got["old"] || got["live"] {
		t.Fatalf("GET /api/v1/streams unlisted flags %v, want old unlisted and live listed", got)
	}
	del := func(tok, name string) (int, string, string) {
		return runPeat(t, []string{"PEAT_TOKEN=" + tok}, "stream", "delete", "--http", p.httpAddr, name)
	}
	if code, _, errs := del(toks["read"], "old"); code != 1 || !strings.Contains(errs, "403") {
		t.Fatalf("delete with a read token: exit %d, %q; want 1 and 403", code, errs)
	}
	if code, _, errs := del(toks["admin"], "live"); code != 1 || !strings.Contains(errs, "remove it from streams:") {
		t.Fatalf("delete of a listed stream: exit %d, %q; want 1 and how to proceed", code, errs)
	}
	if code, _, errs := del(toks["admin"], "nope"); code != 1 || !strings.Contains(errs, "404") {
		t.Fatalf("delete of an unknown stream: exit %d, %q; want 1 and 404", code, errs)
	}
	if code, out, errs := del(toks["admin"], "old"); code != 0 || !strings.Contains(out, "deleted old: 20 records") {
		t.Fatalf("delete old: exit %d, %q %q", code, out, errs)
	}
	if got := streamsAPI(); len(got) != 1 {
		t.Fatalf("streams after the deletion: %v, want live alone", got)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("peat exited %d", code)
	}

	p = startPeat(t, data, "--config", conf(false, "old", "live"))
	if s := p.stream("old"); s.FirstOffset != 0 || s.NextOffset != 0 {
		t.Fatalf("old listed again: offsets %d-%d, want a new, empty stream", s.FirstOffset, s.NextOffset)
	}
	publishN(t, p.mqttAddr, "old/x", 1)
	if s := p.stream("old"); s.NextOffset != 1 {
		t.Fatalf("old after one publish: next offset %d, want 1", s.NextOffset)
	}
	if s := p.stream("live"); s.NextOffset != 3 {
		t.Fatalf("live: next offset %d, want its 3 records", s.NextOffset)
	}
}

// httpGetToken is GET /api/v1/streams with a bearer token.
func httpGetToken(t *testing.T, url, tok string) []edge.StreamInfo {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	var out []edge.StreamInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}
