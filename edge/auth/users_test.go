package auth

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

func writeFile(tb testing.TB, name, content string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

func newAuth(tb testing.TB, cfg Config) *Auth {
	tb.Helper()
	a, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return a
}

// login reports whether name/password is let in.
func login(a *Auth, name, password string) bool {
	_, _, ok := a.Authenticate("c-"+name, name, []byte(password), nil)
	return ok
}

func TestUsers_ArgonHashFromPeatPasswd(t *testing.T) {
	h, err := HashPassword("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=8192,t=3,p=1$") {
		t.Fatalf("hash %q: want an argon2id PHC string", h)
	}
	a := newAuth(t, Config{UsersFile: writeFile(t, "users", "# sensors\nalice:"+h+"\n\n")})
	if !login(a, "alice", "s3cret") {
		t.Error("the right password is refused")
	}
	for _, bad := range [][2]string{{"alice", "s3creT"}, {"alice", ""}, {"bob", "s3cret"}, {"", ""}} {
		if login(a, bad[0], bad[1]) {
			t.Errorf("%q/%q let in", bad[0], bad[1])
		}
	}
}

func TestUsers_Bcrypt(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, Config{UsersFile: writeFile(t, "users", "u:"+string(h)+"\n")})
	if !login(a, "u", "pw") || login(a, "u", "px") {
		t.Error("bcrypt: want the right password in and a wrong one out")
	}
}

// Lines Debian's mosquitto_passwd 2.0.11 wrote (known vectors; the next
// test makes fresh ones with the real tool).
const mosquittoVectors = `alice:$7$101$eSQ2xXMGhDpt/N27$OB240zqWHET+2gyd4my/OPkd+DH8prxvCXKB+trQZs67i+jQnil11jWOz1WAVFFdcMsFWFR9gT4OfhYlPy/++g==
bob:$6$anTtQ+rVZxnz/nlE$SWoNT7kNUULvzISHiAUmC+tpeanAM0NEel2tqeCDl98+YWTCnkvUtTZlNHHT9yBI4XQftBzYNihUm52SXNqFOw==
`

func TestUsers_MosquittoVectors(t *testing.T) {
	a := newAuth(t, Config{UsersFile: writeFile(t, "users", mosquittoVectors)})
	for _, c := range []struct {
		user, pw string
		want     bool
	}{{"alice", "secret1", true}, {"alice", "secret2", false}, {"bob", "secret2", true}, {"bob", "secret1", false}} {
		if got := login(a, c.user, c.pw); got != c.want {
			t.Errorf("%s/%s: %v, want %v", c.user, c.pw, got, c.want)
		}
	}
}

// A file made by Debian's mosquitto_passwd, both its hash kinds, is
// accepted as it is.
func TestUsers_RealMosquittoPasswdFile(t *testing.T) {
	tool, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Fatalf("mosquitto_passwd not found (Debian: apt-get install mosquitto; scripts/test-deps.sh installs it): %v", err)
	}
	path := filepath.Join(t.TempDir(), "passwd")
	for _, args := range [][]string{
		{"-c", "-b", path, "pbkdf2user", "pw one"},
		{"-H", "sha512", "-b", path, "sha512user", "pw-two"},
		{"-H", "sha512-pbkdf2", "-b", path, "third", "três"},
	} {
		if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd %v: %v\n%s", args, err, out)
		}
	}
	a := newAuth(t, Config{UsersFile: path})
	if u, _ := a.Counts(); u != 3 {
		t.Fatalf("%d users loaded, want 3", u)
	}
	for user, pw := range map[string]string{"pbkdf2user": "pw one", "sha512user": "pw-two", "third": "três"} {
		if !login(a, user, pw) {
			t.Errorf("%s: right password refused", user)
		}
		if login(a, user, pw+"x") {
			t.Errorf("%s: wrong password let in", user)
		}
	}
}

// A users file Peat cannot fully read is refused, so a node never runs
// with half its users or, worse, none.
func TestUsers_BadFileFailsClosed(t *testing.T) {
	for name, content := range map[string]string{
		"plain-text password": "alice:secret\n",
		"no colon":            "alice\n",
		"duplicate":           mosquittoVectors + strings.SplitN(mosquittoVectors, "\n", 2)[0] + "\n",
		"bad base64":          "a:$7$101$!!$!!\n",
		"huge argon memory":   "a:$argon2id$v=19$m=99999999,t=3,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n",
	} {
		if _, err := New(Config{UsersFile: writeFile(t, "users", content)}); err == nil {
			t.Errorf("%s: loaded", name)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the file's secret: %v", name, err)
		}
	}
	if _, err := New(Config{UsersFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("a missing users file loaded")
	}
}

// hashCounter counts verifications that really hash, and the most that ran
// at once.
type hashCounter struct {
	hash
	n, running, peak atomic.Int64
	gate             chan struct{}
}

func (h *hashCounter) verify(pw []byte) bool {
	h.n.Add(1)
	r := h.running.Add(1)
	for {
		p := h.peak.Load()
		if r <= p || h.peak.CompareAndSwap(p, r) {
			break
		}
	}
	if h.gate != nil {
		<-h.gate
	}
	defer h.running.Add(-1)
	return h.hash.verify(pw)
}

// A reconnect storm of one device costs one hash, and many devices at once
// never run more hashes than the bound.
func TestUsers_CacheAndConcurrencyBound(t *testing.T) {
	h, _ := HashPassword("pw")
	parsed, _ := parseHash(h)
	a := newAuth(t, Config{UsersFile: writeFile(t, "users", "dev:"+h+"\n"), MaxConcurrentHashes: 2})
	hc := &hashCounter{hash: parsed}
	set := a.cur.Load()
	set.users.m["dev"] = user{raw: set.users.m["dev"].raw, h: hc}
	for range 10 {
		if !login(a, "dev", "pw") {
			t.Fatal("refused")
		}
	}
	if n := hc.n.Load(); n != 1 {
		t.Errorf("10 logins with the same password hashed %d times, want 1", n)
	}
	for range 2 { // a refusal is not cached as a success
		if login(a, "dev", "nope") {
			t.Error("wrong password let in")
		}
	}

	hc.gate = make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			login(a, "dev", "other"+string(rune('a'+i))) // distinct: no cache hits
		}()
	}
	testwait.Eventually(t, "both checks run", func() bool { return hc.running.Load() == 2 })
	close(hc.gate)
	wg.Wait()
	if p := hc.peak.Load(); p > 2 {
		t.Errorf("%d hashes ran at once, want at most 2", p)
	}
}

// Refused logins cost the same whatever they got wrong, so timing tells
// no one which user names exist: an unknown user is checked against a
// dummy of the kind and cost most of the file's users have (here
// mosquitto_passwd's $7$, not Peat's argon2id), one hash as for a listed
// user; and a wrong password tried again is hashed again (a cache of
// refusals made repeats 80 times faster than the first try, an oracle for
// which names were tried).
func TestUsers_RefusalsCostOneHashAlike(t *testing.T) {
	h1, _ := parseHash("$7$101$eSQ2xXMGhDpt/N27$OB240zqWHET+2gyd4my/OPkd+DH8prxvCXKB+trQZs67i+jQnil11jWOz1WAVFFdcMsFWFR9gT4OfhYlPy/++g==")
	file := "alice:$7$101$eSQ2xXMGhDpt/N27$OB240zqWHET+2gyd4my/OPkd+DH8prxvCXKB+trQZs67i+jQnil11jWOz1WAVFFdcMsFWFR9gT4OfhYlPy/++g==\n" +
		"bob:$7$101$anTtQ+rVZxnz/nlE$SWoNT7kNUULvzISHiAUmC+tpeanAM0NEel2tqeCDl98+YWTCnkvUtTZlNHHT9yBI4XQftBzYNihUm52SXNqFOw==\n"
	a := newAuth(t, Config{UsersFile: writeFile(t, "users", file)})
	set := a.cur.Load()

	if login(a, "nobody", "pw") {
		t.Fatal("an unknown user got in")
	}
	dummy := set.users.dummyFor(nil)
	if dummy == nil || costKey(dummy) != costKey(h1) {
		t.Fatalf("the dummy for unknown users is %v, want %s like the file's users", dummy, costKey(h1))
	}
	dc := &hashCounter{hash: dummy}
	set.users.dummy.h = dc
	ac := &hashCounter{hash: set.users.m["alice"].h}
	set.users.m["alice"] = user{raw: set.users.m["alice"].raw, h: ac}
	for range 5 {
		login(a, "nobody", "same")
		login(a, "alice", "same")
	}
	if d, k := dc.n.Load(), ac.n.Load(); d != 5 || k != 5 {
		t.Errorf("5 refusals each hashed %d times for an unknown user and %d for alice, want 5 and 5", d, k)
	}
}
