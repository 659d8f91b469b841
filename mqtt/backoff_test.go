package mqtt

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// passwordAuth lets in the users it lists with their passwords, and lets
// them do everything.
type passwordAuth map[string]string

func (a passwordAuth) Authenticate(l Login) (Access, string, bool) {
	if pw, ok := a[l.Username]; !ok || pw != string(l.Password) {
		return nil, "bad user name or password", false
	}
	return &testAccess{a: &testAuth{rules: []testRule{{filter: "#", read: true, write: true, allow: true}}}}, "", true
}

// loginFrom connects from the local address ip as user with password pw
// and returns the CONNACK's reason code.
func loginFrom(tb testing.TB, b *Broker, ip string, version byte, user, pw string) byte {
	tb.Helper()
	c := mqtttest.Handshake(tb, dialFrom(tb, b, ip), mqtttest.Connect{ClientID: "c-" + user + "-" + ip, Version: version,
		Clean: true, Username: user, Password: pw})
	c.Close()
	return c.Connack.ReasonCode
}

// Failed logins slow down the address and the user name they came from
// and for, not others: serial guesses from one address wait out a delay
// doubling up to the bound, parallel ones are refused beyond it (0x9F),
// another address logs in without waiting, and the attacked user still
// gets in with the right password.
func TestAuth_LoginBackoff(t *testing.T) {
	const base, most = 20 * time.Millisecond, 80 * time.Millisecond
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) {
		c.Auth = passwordAuth{"alice": "right", "bob": "pw-b"}
		c.LoginBackoff, c.MaxLoginBackoff = base, most
		c.Metrics = m
	})
	backoffs := func(by string) float64 { return metricValue(m.LoginBackoff.WithLabelValues(by)) }

	const guesses = 12
	start := time.Now()
	for range guesses {
		if code := loginFrom(t, b, "127.0.0.2", 5, "alice", "guess"); code != packets.ErrBadUsernameOrPassword.Code {
			t.Fatalf("a wrong password: CONNACK %#x, want 0x86", code)
		}
	}
	// Each guess but the first waited for the one before: 20+40+80x9 ms.
	if took, least := time.Since(start), base+2*base+(guesses-3)*most; took < least {
		t.Errorf("%d serial guesses took %v, want at least %v", guesses, took, least)
	}

	byAddr := backoffs(backoffBySource)
	if code := loginFrom(t, b, "127.0.0.1", 5, "bob", "pw-b"); code != 0 {
		t.Fatalf("bob from another address: CONNACK %#x", code)
	}
	if backoffs(backoffBySource) != byAddr || backoffs(backoffByUser) != 0 {
		t.Error("bob, from another address, waited")
	}

	if code := loginFrom(t, b, "127.0.0.3", 5, "alice", "right"); code != 0 {
		t.Fatalf("alice with her password during the guessing: CONNACK %#x", code)
	}
	if backoffs(backoffByUser) != 1 {
		t.Errorf("alice's login waited by user %v times, want 1", backoffs(backoffByUser))
	}
	loginFrom(t, b, "127.0.0.3", 5, "alice", "right")
	if backoffs(backoffByUser) != 1 {
		t.Error("a right password did not clear alice's failures")
	}

	// Parallel guesses queue behind each other; beyond the bound they are
	// refused unchecked.
	codes := make(chan byte, 6)
	var wg sync.WaitGroup
	for i := range cap(codes) {
		wg.Go(func() { codes <- loginFrom(t, b, "127.0.0.2", byte(4+i%2), "alice", "guess") })
	}
	wg.Wait()
	close(codes)
	refused := 0
	for code := range codes {
		if code == packets.ErrConnectionRateExceeded.Code || code == packets.Err3ServerUnavailable.Code {
			refused++
		}
	}
	if refused == 0 {
		t.Error("6 parallel guesses from one address: none refused")
	}
	if got := metricValue(m.Denied.WithLabelValues(DeniedThrottled)); got != float64(refused) {
		t.Errorf("denied{throttled} = %v, want %d", got, refused)
	}
}

// The rule, on its own clock.
func TestLoginBackoff_Rule(t *testing.T) {
	b := newLoginBackoff(10*time.Millisecond, 40*time.Millisecond)
	src := netip.MustParsePrefix("192.0.2.1/32")
	now := time.Unix(1000, 0)
	for i, want := range []time.Duration{0, 10, 20, 40, 40} {
		wait, _, ok := b.admit(src, "u", now)
		if !ok || wait != want*time.Millisecond {
			t.Fatalf("attempt %d: wait %v ok %v, want %v", i, wait, ok, want*time.Millisecond)
		}
		now = now.Add(wait)
		b.result(src, "u", false, now)
	}
	// Forgotten after a quiet spell.
	now = now.Add(b.rule.forget() + time.Second)
	if wait, _, _ := b.admit(src, "u", now); wait != 0 {
		t.Errorf("after %v without a failure: wait %v", b.rule.forget(), wait)
	}
	if d := (backoffRule{base: time.Second, max: time.Minute}).delay(200); d != time.Minute {
		t.Errorf("delay(200) = %v, want the bound", d)
	}
}
