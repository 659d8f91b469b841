package sitetest

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// partitionEnv turns the partition tests on: "1" all of them (make
// test-partition), "core" the corePartitions (make test-cluster). Either
// turns a missing root or nft from a skip into a failure.
const partitionEnv = "PEAT_PARTITION"

// corePartitions are the partition tests make test-cluster runs too, at
// the default rounds: the fault that froze a whole site before broker
// heartbeats (the leader-controller link alone) and a leader cut off
// from the rest.
var corePartitions = map[string]bool{"leader-controller-link": true, "leader-isolated": true}

// needNetns skips a test that runs a site of namespaces where it cannot
// (not root, no ip or nft), and fails it there under PEAT_PARTITION=1:
// make test-partition must not pass without having run.
func needNetns(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (apt-get install "+map[string]string{"ip": "iproute2", "nft": "nftables"}[tool]+")")
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "network namespaces and nftables need " + strings.Join(missing, ", ")
	if v := os.Getenv(partitionEnv); v != "" {
		t.Fatal(msg + " (" + partitionEnv + "=" + v + ")")
	}
	t.Skip(msg)
}

// needPartition keeps the partition tests, minutes each, out of make
// test-cluster but for the core ones: they run with PEAT_SITETEST=1 and
// PEAT_PARTITION=1, the core ones (kind) with PEAT_PARTITION=core too.
func needPartition(t *testing.T, kind string) {
	t.Helper()
	needSite(t)
	switch v := os.Getenv(partitionEnv); {
	case v == "1", v == "core" && corePartitions[kind]:
	default:
		t.Skip("partition rounds run for minutes: set " + partitionEnv + "=1 too (make test-partition)")
	}
	needNetns(t)
}

// netns is a site's network: node k (1-based) in namespace
// peat-<pid>-<seq>-n<k> at <subnet>.k, its veth's other end (pv<pid>s<seq>n<k>)
// on the bridge pb<pid>s<seq>, which holds <subnet>.254 in the root namespace, where the
// test and its clients stay. Faults are nftables rules in a node's
// namespace (table inet peat_fault) that drop what comes in from a cut
// peer; a cut sets them in both namespaces. A silent drop, a pulled
// cable: not a reset, and no drop on output either, which would fail the
// sender's connect() at once with EPERM where a pulled cable leaves it
// waiting for a SYN-ACK.
type netns struct {
	t      testing.TB
	prefix string // peat-<pid>-<seq>
	tag    string // <pid>s<seq>, in interface names (15 bytes at most)
	subnet string // 10.a.b
	n      int

	mu  sync.Mutex
	cut map[[2]int]bool // node pairs (lower first) cut now
}

// nsName, linkName match the namespaces and links newNetns makes, with
// the pid of the test that made them.
var (
	nsName   = regexp.MustCompile(`^peat-(\d+)-\d+-n\d+$`)
	linkName = regexp.MustCompile(`^p[bv](\d+)s\d+(n\d+)?$`)
)

// netSeq numbers the sites of namespaces of this process: a site's names
// are new even while the kernel still destroys the last one's.
var netSeq atomic.Int64

func newNetns(t testing.TB, n int) *netns {
	t.Helper()
	pid, seq := os.Getpid(), netSeq.Add(1)
	// A /24 from the pid: two tests of different processes do not share
	// one, and 10.100-199.x.0 is unlikely to be a LAN of the machine.
	nw := &netns{t: t, prefix: fmt.Sprintf("peat-%d-%d", pid, seq), tag: fmt.Sprintf("%ds%d", pid, seq),
		subnet: fmt.Sprintf("10.%d.%d", 100+pid%100, (pid/100)%256), n: n, cut: map[[2]int]bool{}}
	removeLeftovers(t, seq == 1)
	t.Cleanup(nw.remove)
	br := "pb" + nw.tag
	nw.run("ip", "link", "add", br, "type", "bridge")
	nw.run("ip", "addr", "add", nw.subnet+".254/24", "dev", br)
	nw.run("ip", "link", "set", br, "up")
	for k := 1; k <= n; k++ {
		ns, veth := nw.ns(k), fmt.Sprintf("pv%sn%d", nw.tag, k)
		nw.run("ip", "netns", "add", ns)
		nw.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		nw.run("ip", "link", "set", veth, "master", br, "up")
		nw.run("ip", "-n", ns, "addr", "add", nw.ip(k)+"/24", "dev", "eth0")
		nw.run("ip", "-n", ns, "link", "set", "eth0", "up")
		nw.run("ip", "-n", ns, "link", "set", "lo", "up")
		nw.nft(k, `add table inet peat_fault
add set inet peat_fault peers { type ipv4_addr; }
add chain inet peat_fault input { type filter hook input priority -10; policy accept; }
add rule inet peat_fault input ip saddr @peers drop`)
	}
	return nw
}

func (nw *netns) ns(k int) string { return fmt.Sprintf("%s-n%d", nw.prefix, k) }
func (nw *netns) ip(k int) string { return fmt.Sprintf("%s.%d", nw.subnet, k) }

// run runs a command of the setup; a failure fails the test.
func (nw *netns) run(name string, args ...string) {
	nw.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		nw.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// nft runs an nft script in node k's namespace.
func (nw *netns) nft(k int, script string) {
	nw.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", nw.ns(k), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		nw.t.Fatalf("nft in %s: %v\n%s\n%s", nw.ns(k), err, script, out)
	}
}

// remove deletes the veths, namespaces and the bridge. A veth would go
// with its namespace, but the kernel destroys a namespace later, in the
// background; deleting it here frees its address now.
func (nw *netns) remove() {
	for k := 1; k <= nw.n; k++ {
		_ = exec.Command("ip", "link", "del", fmt.Sprintf("pv%sn%d", nw.tag, k)).Run()
		_ = exec.Command("ip", "netns", "del", nw.ns(k)).Run()
	}
	_ = exec.Command("ip", "link", "del", "pb"+nw.tag).Run()
}

// removeLeftovers deletes the namespaces and links of an earlier test
// process that died before its cleanup (or, on this process's first
// site, of its pid, reused), with the peat processes still running in
// them.
func removeLeftovers(t testing.TB, first bool) {
	dead := func(pid string) bool {
		if pid == strconv.Itoa(os.Getpid()) {
			return first
		}
		_, err := os.Stat("/proc/" + pid)
		return err != nil
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := nsName.FindStringSubmatch(f[0])
		if m == nil || !dead(m[1]) {
			continue
		}
		pids, _ := exec.Command("ip", "netns", "pids", f[0]).Output()
		for _, p := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL) // a peat a dead test left
			}
		}
		t.Logf("removing the leftover namespace %s", f[0])
		_ = exec.Command("ip", "netns", "del", f[0]).Run()
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line) // "7: pb123s1: <...>", "8: pv123s1n1@if2: <...>"
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if m := linkName.FindStringSubmatch(name); m != nil && dead(m[1]) {
			t.Logf("removing the leftover link %s", name)
			_ = exec.Command("ip", "link", "del", name).Run()
		}
	}
}

func pair(a, b int) [2]int { return [2]int{min(a, b), max(a, b)} }

// cutLinks drops every packet between node a and node b (1-based), both
// ways, in both namespaces; healLinks lets them through again. Clients in
// the root namespace still reach both.
func (nw *netns) cutLinks(a, b int) {
	nw.t.Helper()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.cut[pair(a, b)] {
		return
	}
	nw.nft(a, fmt.Sprintf("add element inet peat_fault peers { %s }", nw.ip(b)))
	nw.nft(b, fmt.Sprintf("add element inet peat_fault peers { %s }", nw.ip(a)))
	nw.cut[pair(a, b)] = true
}

func (nw *netns) healLinks(a, b int) {
	nw.t.Helper()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if !nw.cut[pair(a, b)] {
		return
	}
	nw.nft(a, fmt.Sprintf("delete element inet peat_fault peers { %s }", nw.ip(b)))
	nw.nft(b, fmt.Sprintf("delete element inet peat_fault peers { %s }", nw.ip(a)))
	delete(nw.cut, pair(a, b))
}

// healAll heals every cut link.
func (nw *netns) healAll() {
	nw.t.Helper()
	nw.mu.Lock()
	var pairs [][2]int
	for p := range nw.cut {
		pairs = append(pairs, p)
	}
	nw.mu.Unlock()
	for _, p := range pairs {
		nw.healLinks(p[0], p[1])
	}
}

// index is a node's number in the site's network (1-based).
func (s *site) index(nd *node) int { return slices.Index(s.nodes, nd) + 1 }

// cut drops every packet between two nodes; heal ends it.
func (s *site) cut(a, b *node)  { s.net.cutLinks(s.index(a), s.index(b)) }
func (s *site) heal(a, b *node) { s.net.healLinks(s.index(a), s.index(b)) }

// isolate cuts nd from every other node; its clients still reach it.
func (s *site) isolate(nd *node) {
	for _, o := range s.nodes {
		if o != nd {
			s.cut(nd, o)
		}
	}
}

// split cuts every node of a from every node of b.
func (s *site) split(a, b []*node) {
	for _, x := range a {
		for _, y := range b {
			s.cut(x, y)
		}
	}
}

// healAll heals every cut.
func (s *site) healAll() { s.net.healAll() }
