package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// setPassword runs `peat passwd FILE USER` with pw on standard input.
func setPassword(tb testing.TB, file, user, pw string, flags ...string) string {
	tb.Helper()
	var out, errs bytes.Buffer
	args := append(append([]string(nil), flags...), file, user)
	if code := passwd(args, strings.NewReader(pw+"\n"), &out, &errs); code != exitOK {
		tb.Fatalf("peat passwd %v: exit %d: %s", args, code, errs.String())
	}
	return out.String()
}

// login reports whether the users file lets user in with pw.
func login(tb testing.TB, file, user, pw string) bool {
	tb.Helper()
	a, err := auth.New(auth.Config{UsersFile: file})
	if err != nil {
		tb.Fatalf("load %s: %v", file, err)
	}
	_, _, ok := a.Authenticate("c", user, []byte(pw), nil)
	return ok
}

func TestPasswd_AddChangeDelete(t *testing.T) {
	file := filepath.Join(t.TempDir(), "users")
	if out := setPassword(t, file, "alice", "one"); !strings.Contains(out, "added alice") {
		t.Errorf("output %q", out)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("new users file: %v, mode %v, want 0600", err, st.Mode().Perm())
	}
	f, _ := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("# the gateway\n")
	_ = f.Close()
	setPassword(t, file, "bob", "two")
	if out := setPassword(t, file, "alice", "three"); !strings.Contains(out, "changed") {
		t.Errorf("output %q", out)
	}
	if !login(t, file, "alice", "three") || login(t, file, "alice", "one") || !login(t, file, "bob", "two") {
		t.Fatal("passwords after a change: want alice/three and bob/two only")
	}
	setPassword(t, file, "bob", "", "-D")
	if login(t, file, "bob", "two") {
		t.Error("bob still logs in after -D")
	}
	text, _ := os.ReadFile(file)
	if !strings.Contains(string(text), "# the gateway") || strings.Count(string(text), "alice:") != 1 {
		t.Errorf("file after the changes:\n%s\nwant the comment kept and one alice line", text)
	}
	if strings.Contains(string(text), "three") {
		t.Error("the password is in the file")
	}
	var errs bytes.Buffer
	if code := passwd([]string{file, "a:b"}, strings.NewReader("x\n"), &bytes.Buffer{}, &errs); code != exitUsage {
		t.Errorf("user a:b: exit %d, want %d", code, exitUsage)
	}
	if code := passwd([]string{file, "carol"}, strings.NewReader("\n"), &bytes.Buffer{}, &errs); code == exitOK {
		t.Error("an empty password was accepted")
	}
}

// tryLogin connects to addr as user and returns the CONNACK's reason code.
func tryLogin(tb testing.TB, addr, user, pw string) byte {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	c := mqtttest.Handshake(tb, conn, mqtttest.Connect{ClientID: "c-" + user, Version: 5, Clean: true,
		Username: user, Password: pw})
	c.Close()
	if c.Connack.FixedHeader.Type != packets.Connack {
		tb.Fatalf("no CONNACK for %s", user)
	}
	return c.Connack.ReasonCode
}

// waitLog waits until the process has logged msg n times.
func waitLog(tb testing.TB, p *peatProc, msg string, n int) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(p.log(), `"msg":"`+msg+`"`) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("no %q in the log:\n%s", msg, p.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SIGHUP reloads the users file: a user added with `peat passwd` gets in
// without a restart, and a broken file keeps the users in force.
func TestServe_SIGHUPReloadsUsers(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	setPassword(t, users, "alice", "pw-a")
	conf := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(conf, []byte("auth: {users_file: "+users+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, t.TempDir(), "--config", conf)
	bad := packets.ErrBadUsernameOrPassword.Code
	if got := tryLogin(t, p.mqttAddr, "alice", "pw-a"); got != 0 {
		t.Fatalf("alice: CONNACK %#x", got)
	}
	if got := tryLogin(t, p.mqttAddr, "bob", "pw-b"); got != bad {
		t.Fatalf("bob before he is added: CONNACK %#x, want %#x", got, bad)
	}

	setPassword(t, users, "bob", "pw-b")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "auth reloaded", 1)
	if got := tryLogin(t, p.mqttAddr, "bob", "pw-b"); got != 0 {
		t.Fatalf("bob after SIGHUP: CONNACK %#x", got)
	}

	if err := os.WriteFile(users, []byte("alice:plain-text\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "auth reload failed; keeping the rules in force", 1)
	if got := tryLogin(t, p.mqttAddr, "alice", "pw-a"); got != 0 {
		t.Fatalf("alice after a failed reload: CONNACK %#x", got)
	}
	if strings.Contains(p.log(), "plain-text") {
		t.Error("the log shows the file's password")
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
}

// `peat token` prints the token once and stores only its hash, in a file
// the node accepts.
func TestToken_PrintsOnceStoresTheHash(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	var out, errs bytes.Buffer
	if code := token([]string{file, "grafana", "read"}, &out, &errs); code != exitOK {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	tok := strings.TrimSpace(out.String())
	text, _ := os.ReadFile(file)
	if len(tok) < 40 || strings.Contains(string(text), tok) || !strings.HasPrefix(string(text), "grafana:read:") {
		t.Fatalf("token %q, file %q: want a long token and only its hash stored", tok, text)
	}
	toks, err := auth.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	if name, role, ok := toks.Check(tok); !ok || name != "grafana" || role != auth.RoleRead {
		t.Errorf("Check: %q %q %v", name, role, ok)
	}
	if code := token([]string{file, "x", "root"}, &out, &errs); code != exitUsage {
		t.Errorf("role root: exit %d, want %d", code, exitUsage)
	}
}
