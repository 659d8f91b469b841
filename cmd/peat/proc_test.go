package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/peatmq/peat/edge"
)

// Version and commit the test binary is built with.
const (
	testVersion = "v9.9.9-test"
	testCommit  = "c0ffee1"
)

// binPath is the peat binary TestMain builds once for every test.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "peat-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "peat")
	build := exec.Command("go", "build", "-o", binPath,
		"-ldflags", "-X main.version="+testVersion+" -X main.commit="+testCommit, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build peat: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runPeat runs the binary to completion and returns its exit status,
// stdout and stderr.
func runPeat(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Dir = t.TempDir() // nothing lands in the package directory
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("run peat %q: %v", args, err)
	}
	return 0, stdout.String(), stderr.String()
}

// cleanEnv is the test's environment without PEAT_ variables, so a
// developer's settings do not leak into the child.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEAT_") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			env = append(env, kv)
		}
	}
	return env
}

// peatProc is a running `peat serve`.
type peatProc struct {
	t        testing.TB
	cmd      *exec.Cmd
	mqttAddr string
	httpAddr string
	exited   chan struct{} // closed when the process has been waited for
	exitErr  error

	mu     sync.Mutex
	stderr bytes.Buffer
}

// startPeat starts `peat serve` on dataDir with MQTT and HTTP on free
// loopback ports, and returns once it logs that it serves. The process is
// killed at test cleanup if it still runs.
func startPeat(t testing.TB, dataDir string, extraArgs ...string) *peatProc {
	t.Helper()
	return startPeatEnv(t, nil, dataDir, extraArgs...)
}

// startPeatEnv is startPeat with env added to the process's environment.
func startPeatEnv(t testing.TB, env []string, dataDir string, extraArgs ...string) *peatProc {
	t.Helper()
	args := append([]string{"serve", "--data", dataDir, "--mqtt", "127.0.0.1:0", "--http", "127.0.0.1:0"}, extraArgs...)
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(append(cleanEnv(), "PEAT_LOG_FORMAT=json", "PEAT_STORAGE_PROFILE=pi-zero"), env...)
	cmd.Dir = t.TempDir()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peat: %v", err)
	}
	p := &peatProc{t: t, cmd: cmd, exited: make(chan struct{})}
	serving := make(chan [2]string, 1)
	logDone := make(chan struct{})
	go func() { // owned by this peatProc: ends when the process closes stderr
		defer close(logDone)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.mu.Lock()
			p.stderr.Write(line)
			p.stderr.WriteByte('\n')
			p.mu.Unlock()
			var rec struct{ Msg, MQTT, HTTP string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "node serving" {
				select {
				case serving <- [2]string{rec.MQTT, rec.HTTP}:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, pipe)
	}()
	go func() { // owned by this peatProc: reaps the process
		<-logDone // Wait must not race the pipe reader
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case addrs := <-serving:
		p.mqttAddr, p.httpAddr = addrs[0], addrs[1]
	case <-p.exited:
		t.Fatalf("peat exited before serving: %v\n%s", p.exitErr, p.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("peat did not log \"node serving\" within a minute\n%s", p.log())
	}
	return p
}

func (p *peatProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *peatProc) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatalf("kill -9 peat: %v", err)
	}
	<-p.exited
}

// stop sends sig and waits (at most a minute) for the exit status.
func (p *peatProc) stop(sig os.Signal) int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal peat: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.t.Fatalf("peat still runs a minute after %v\n%s", sig, p.log())
	}
	var exit *exec.ExitError
	if errors.As(p.exitErr, &exit) {
		return exit.ExitCode()
	}
	if p.exitErr != nil {
		p.t.Fatalf("wait for peat: %v", p.exitErr)
	}
	return 0
}

// streams is GET /api/v1/streams.
func (p *peatProc) streams() []edge.StreamInfo {
	p.t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/api/v1/streams")
	if err != nil {
		p.t.Fatalf("GET /api/v1/streams: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		p.t.Fatalf("GET /api/v1/streams: %s %s", resp.Status, body)
	}
	var out []edge.StreamInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		p.t.Fatalf("decode /api/v1/streams: %v", err)
	}
	return out
}

// metric is the value of an unlabelled metric on GET /metrics.
func (p *peatProc) metric(name string) float64 {
	p.t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		p.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var v float64
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			if _, err := fmt.Sscan(rest, &v); err != nil {
				p.t.Fatalf("metric %s: %q: %v", name, rest, err)
			}
			return v
		}
	}
	p.t.Fatalf("no metric %s on /metrics (%v)", name, sc.Err())
	return 0
}

// stream is one stream of GET /api/v1/streams by name.
func (p *peatProc) stream(name string) edge.StreamInfo {
	p.t.Helper()
	for _, s := range p.streams() {
		if s.Name == name {
			return s
		}
	}
	p.t.Fatalf("no stream %q in /api/v1/streams", name)
	return edge.StreamInfo{}
}
