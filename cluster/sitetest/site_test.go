package sitetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// streamSpec is one configured stream: every node lists the same ones.
type streamSpec struct{ name, filter string }

// topic is a topic the stream captures.
func (s streamSpec) topic() string { return strings.TrimSuffix(s.filter, "#") + "load" }

// role is a node's last "cluster: replica role" line for a stream.
type role struct {
	leader   bool
	leaderID string
	epoch    uint64
}

// isrSeen is a leader's last "cluster: proposing ISR" line for a stream.
type isrSeen struct {
	members []string
	at      time.Time
}

// node is one `peat serve` process of the site, restartable on the same
// ports and data directory.
type node struct {
	t                                 testing.TB
	id, dir, cfgPath                  string
	mqtt, http, serf, raft, transport string
	// ns and ip are the node's network namespace and address in a
	// site of namespaces (newSiteNetns); "" on loopback.
	ns, ip string

	mu struct {
		sync.Mutex
		cmd        *exec.Cmd
		exited     chan struct{}
		startedAt  time.Time
		serving    bool
		controller bool
		roles      map[string]role
		isr        map[string]isrSeen
	}
}

// site is the nodes of one test.
type site struct {
	t       testing.TB
	nodes   []*node
	streams []streamSpec
	net     *netns // nil on loopback
}

// siteOpts is what newSiteWith builds.
type siteOpts struct {
	voters, brokers int
	mirrors         []streamSpec
	// netns puts each node in its own network namespace behind a bridge
	// (netns_test.go), so that nftables can cut the links between nodes.
	netns bool
}

// wait scales a deadline for slow (emulated) binaries.
func wait(d time.Duration) time.Duration { return d * time.Duration(max(1, *slowFlag)) }

// handedOut is every address freeAddr returned in this process: the
// kernel may hand a port out again as soon as its listener closes, and
// a node given one port twice refuses its configuration.
var handedOut sync.Map

// freeAddr is a loopback address with a port the kernel just handed out
// and no earlier call returned.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if _, seen := handedOut.LoadOrStore(addr, true); !seen {
			return addr
		}
	}
}

// newSite writes the configs of n voters of one site and starts them;
// it returns once every stream has a leader that every node follows.
func newSite(t *testing.T, n int, streams ...streamSpec) *site {
	t.Helper()
	return newSiteOf(t, n, 0, streams...)
}

// newSiteOf is newSite with brokers more nodes after the voters, which
// follow the controller without voting (voter: false, expect: 0).
func newSiteOf(t *testing.T, n, brokers int, streams ...streamSpec) *site {
	t.Helper()
	return newSiteMirrors(t, n, brokers, nil, streams...)
}

// newSiteMirrors is newSiteOf with mirror streams after streams (mirror:
// true: written only by another Peat's peat sink, at its offsets).
func newSiteMirrors(t *testing.T, n, brokers int, mirrors []streamSpec, streams ...streamSpec) *site {
	t.Helper()
	return newSiteWith(t, siteOpts{voters: n, brokers: brokers, mirrors: mirrors}, streams...)
}

// newSiteWith is every newSite* in one.
func newSiteWith(t *testing.T, o siteOpts, streams ...streamSpec) *site {
	t.Helper()
	n, brokers, mirrors := o.voters, o.brokers, o.mirrors
	s := &site{t: t, streams: streams}
	if o.netns {
		// Registered before the nodes' cleanup, so it runs after it:
		// the namespaces go once their processes are dead.
		s.net = newNetns(t, n+brokers)
	}
	dir := t.TempDir()
	var join []string
	for k := 1; k <= n+brokers; k++ {
		nd := &node{t: t, id: fmt.Sprintf("node%d", k), dir: filepath.Join(dir, fmt.Sprintf("node%d", k))}
		if s.net != nil {
			// Each namespace has ports of its own: the defaults, on the
			// node's address.
			nd.ns, nd.ip = s.net.ns(k), s.net.ip(k)
			nd.mqtt, nd.http, nd.serf, nd.raft, nd.transport = nd.ip+":1883", nd.ip+":8080", nd.ip+":7946", nd.ip+":7947", nd.ip+":7948"
		} else {
			nd.mqtt, nd.http, nd.serf, nd.raft, nd.transport = freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
		}
		join = append(join, nd.serf)
		s.nodes = append(s.nodes, nd)
	}
	for k, nd := range s.nodes {
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		voter, expect := true, n
		if k >= n {
			voter, expect = false, 0
		}
		var b strings.Builder
		plain := ""
		if s.net != nil {
			// A private bridge of the test, not a LAN: no tokens, users or
			// TLS.
			plain = ", allow_plaintext: true"
			b.WriteString("auth: {allow_anonymous: true}\n")
		}
		fmt.Fprintf(&b, "data_dir: %s\nlog: {format: json}\nhttp: {listen: %q%s}\nmqtt: {listen: %q%s}\nstreams:\n",
			filepath.Join(nd.dir, "data"), nd.http, plain, nd.mqtt, plain)
		for _, st := range streams {
			fmt.Fprintf(&b, "  - {name: %s, filters: [%q]}\n", st.name, st.filter)
		}
		for _, st := range mirrors {
			fmt.Fprintf(&b, "  - {name: %s, mirror: true, filters: [%q]}\n", st.name, st.filter)
		}
		fmt.Fprintf(&b, "cluster:\n  name: sitetest\n  node_id: %s\n  listen: %q\n  raft_listen: %q\n  transport_listen: %q\n"+
			"  join: [%s]\n  voter: %v\n  expect: %d\n", nd.id, nd.serf, nd.raft, nd.transport, `"`+strings.Join(join, `", "`)+`"`, voter, expect)
		if s.net != nil {
			b.WriteString("  allow_plaintext: true\n")
		}
		nd.cfgPath = filepath.Join(nd.dir, "peat.yaml")
		if err := os.WriteFile(nd.cfgPath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, nd := range s.nodes {
			nd.kill()
		}
		if t.Failed() {
			for _, nd := range s.nodes {
				nd.dumpLog(40)
			}
		}
	})
	for _, nd := range s.nodes {
		nd.start()
	}
	for _, nd := range s.nodes {
		nd.waitServing()
	}
	for _, st := range append(slices.Clone(streams), mirrors...) {
		s.leader(st.name)
	}
	return s
}

// start runs the node's process and follows its log.
func (nd *node) start() {
	nd.t.Helper()
	args := []string{"serve", "--config", nd.cfgPath}
	name := binPath
	if *execFlag != "" {
		name, args = *execFlag, append([]string{binPath}, args...)
	}
	if nd.ns != "" {
		// ip netns exec execs (no fork): the process is peat itself, so
		// kill -9, SIGSTOP and SIGCONT reach it.
		name, args = "ip", append([]string{"netns", "exec", nd.ns, name}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = nd.dir
	cmd.Env = cleanEnv()
	logf, err := os.OpenFile(filepath.Join(nd.dir, "peat.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		nd.t.Fatal(err)
	}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		nd.t.Fatal(err)
	}
	cmd.Stdout = logf
	if err := cmd.Start(); err != nil {
		nd.t.Fatalf("start %s: %v", nd.id, err)
	}
	exited := make(chan struct{})
	nd.mu.Lock()
	nd.mu.cmd, nd.mu.exited, nd.mu.startedAt = cmd, exited, time.Now()
	nd.mu.serving, nd.mu.controller = false, false
	nd.mu.roles, nd.mu.isr = map[string]role{}, map[string]isrSeen{}
	nd.mu.Unlock()
	logDone := make(chan struct{})
	go func() { // owned by this start: ends when the process closes stderr
		defer close(logDone)
		sc := bufio.NewScanner(io.TeeReader(pipe, logf))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			nd.follow(sc.Bytes())
		}
		_, _ = io.Copy(io.Discard, pipe)
	}()
	go func() { // owned by this start: reaps the process
		<-logDone
		_ = cmd.Wait()
		logf.Close()
		nd.mu.Lock()
		nd.mu.controller = false
		nd.mu.Unlock()
		close(exited)
	}()
}

// follow takes in one JSON log line.
func (nd *node) follow(line []byte) {
	var rec struct {
		Msg         string `json:"msg"`
		Stream      string `json:"stream"`
		Leader      bool   `json:"leader"`
		LeaderID    string `json:"leader_id"`
		LeaderEpoch uint64 `json:"leader_epoch"`
		ISR         []struct {
			ID string `json:"ID"`
		} `json:"isr"`
	}
	if json.Unmarshal(line, &rec) != nil {
		return
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	switch rec.Msg {
	case "node serving":
		nd.mu.serving = true
	case "cluster: controller":
		nd.mu.controller = true
	case "cluster: no longer the controller":
		nd.mu.controller = false
	case "cluster: replica role":
		nd.mu.roles[rec.Stream] = role{leader: rec.Leader, leaderID: rec.LeaderID, epoch: rec.LeaderEpoch}
	case "cluster: proposing ISR":
		var ids []string
		for _, m := range rec.ISR {
			ids = append(ids, m.ID)
		}
		nd.mu.isr[rec.Stream] = isrSeen{members: ids, at: time.Now()}
	}
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEAT_") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			env = append(env, kv)
		}
	}
	return env
}

func (nd *node) running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.mu.exited == nil {
		return false
	}
	select {
	case <-nd.mu.exited:
		return false
	default:
		return true
	}
}

func (nd *node) waitServing() {
	nd.t.Helper()
	testwait.EventuallyWithin(nd.t, wait(60*time.Second), nd.id+" serving", func() bool {
		nd.mu.Lock()
		defer nd.mu.Unlock()
		return nd.mu.serving
	})
}

// kill is kill -9; it waits until the process is gone.
func (nd *node) kill() {
	nd.mu.Lock()
	cmd, exited := nd.mu.cmd, nd.mu.exited
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// signal sends sig to the node's process (SIGSTOP, SIGCONT).
func (nd *node) signal(sig syscall.Signal) {
	nd.t.Helper()
	nd.mu.Lock()
	cmd := nd.mu.cmd
	nd.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		nd.t.Fatalf("%s: %v: %v", nd.id, sig, err)
	}
}

// stop is SIGTERM (a graceful stop: the node hands its streams over); it
// waits up to a minute for the exit.
func (nd *node) stop() {
	nd.t.Helper()
	nd.mu.Lock()
	cmd, exited := nd.mu.cmd, nd.mu.exited
	nd.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(wait(time.Minute)):
		nd.t.Fatalf("%s still runs a minute after SIGTERM", nd.id)
	}
}

func (nd *node) dumpLog(lines int) {
	data, _ := os.ReadFile(filepath.Join(nd.dir, "peat.log"))
	all := strings.Split(strings.TrimSpace(string(data)), "\n")
	nd.t.Logf("--- last %d log lines of %s:\n%s", lines, nd.id, strings.Join(all[max(0, len(all)-lines):], "\n"))
}

// leader waits until every running node follows one leader of stream in
// one epoch, and that leader runs and leads; it returns it.
func (s *site) leader(stream string) *node {
	s.t.Helper()
	var found *node
	testwait.EventuallyWithin(s.t, wait(90*time.Second), "one leader of "+stream+" that every running node follows", func() bool {
		found = s.leaderNow(stream)
		return found != nil
	})
	return found
}

func (s *site) leaderNow(stream string) *node {
	var want *role
	for _, nd := range s.nodes {
		if !nd.running() {
			continue
		}
		nd.mu.Lock()
		r, ok := nd.mu.roles[stream]
		nd.mu.Unlock()
		if !ok {
			return nil
		}
		if want == nil {
			want = &r
		} else if r.leaderID != want.leaderID || r.epoch != want.epoch {
			return nil
		}
	}
	if want == nil {
		return nil
	}
	ld := s.node(want.leaderID)
	if ld == nil || !ld.running() {
		return nil
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if r := ld.mu.roles[stream]; !r.leader {
		return nil
	}
	return ld
}

// epoch is the leader epoch of stream that the node follows.
func (nd *node) epoch(stream string) uint64 {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.mu.roles[stream].epoch
}

func (s *site) node(id string) *node {
	for _, nd := range s.nodes {
		if nd.id == id {
			return nd
		}
	}
	return nil
}

// controller waits until exactly one running node says it is the
// controller, and returns it.
func (s *site) controller() *node {
	s.t.Helper()
	var found *node
	testwait.EventuallyWithin(s.t, wait(60*time.Second), "one controller", func() bool {
		found = nil
		for _, nd := range s.nodes {
			nd.mu.Lock()
			c := nd.mu.controller
			nd.mu.Unlock()
			if c && nd.running() {
				if found != nil {
					return false
				}
				found = nd
			}
		}
		return found != nil
	})
	return found
}

// waitFullISR waits until stream's leader has proposed, after since, an
// ISR of every node: a node restarted at since is back in sync.
func (s *site) waitFullISR(stream string, since time.Time) {
	s.t.Helper()
	testwait.EventuallyWithin(s.t, wait(90*time.Second), stream+"'s ISR of every node again", func() bool {
		ld := s.leaderNow(stream)
		if ld == nil {
			return false
		}
		ld.mu.Lock()
		seen := ld.mu.isr[stream]
		ld.mu.Unlock()
		if seen.at.Before(since) {
			return false
		}
		for _, nd := range s.nodes {
			if !slices.Contains(seen.members, nd.id) {
				return false
			}
		}
		return true
	})
}

// committed is the node's committed offset of stream (its replica's high
// watermark), from GET /api/v1/streams/<name>.
func (nd *node) committed(stream string) (uint64, error) {
	var info streamInfo
	if err := getJSON(nd.http, "/api/v1/streams/"+stream, &info); err != nil {
		return 0, err
	}
	return info.Committed, nil
}

// streamInfo is GET /api/v1/streams/<name>.
type streamInfo struct {
	Next      uint64 `json:"next_offset"`
	Committed uint64 `json:"committed_offset"`
}

// getJSON decodes GET http://<addr><path>.
func getJSON(addr, path string, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func (s *site) addrs() []string {
	var a []string
	for _, nd := range s.nodes {
		a = append(a, nd.mqtt)
	}
	return a
}
