package edge

import (
	"crypto/sha512"
	"encoding/base64"
	"fmt"
	"slices"
	"testing"
	"time"
)

// mosquitto6Line is a users file line in mosquitto_passwd's $6$ format
// (one SHA-512 of password and salt): a hash far cheaper than the
// argon2id Peat writes.
func mosquitto6Line(name, pw string) string {
	salt := []byte("0123456789abcdef")
	d := sha512.New()
	d.Write([]byte(pw))
	d.Write(salt)
	return name + ":$6$" + base64.StdEncoding.EncodeToString(salt) + "$" + base64.StdEncoding.EncodeToString(d.Sum(nil)) + "\n"
}

// medianLogin is the median time of n refused logins, password(i) for
// the i-th.
func medianLogin(t *testing.T, n *Node, user string, count int, password func(i int) string) time.Duration {
	t.Helper()
	times := make([]time.Duration, count)
	for i := range times {
		start := time.Now()
		c := dialUser(t, n, "x", 5, user, password(i))
		times[i] = time.Since(start)
		if c.Connack.ReasonCode == 0 {
			t.Fatalf("%s/%s let in", user, password(i))
		}
		c.Close()
	}
	slices.Sort(times)
	return times[count/2]
}

// Refused logins take as long whatever they got wrong, so timing tells
// no one which user names exist: an unknown user costs a hash of the
// users file's own kind (here a cheap $6$ one, not Peat's argon2id), and
// a wrong password tried again is hashed again (a cache of answers made
// repeats 80 times faster than the first try: an oracle for which names
// were tried).
func TestNode_RefusedLoginsTakeAlike(t *testing.T) {
	alike := func(t *testing.T, what string, a, b time.Duration) {
		t.Helper()
		if r := float64(max(a, b)) / float64(min(a, b)); r > 3 {
			t.Errorf("%s: %v against %v (%.1fx)", what, a, b, r)
		}
	}
	const tries = 15
	t.Run("unknown user", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t)
		cfg.MQTT.LoginBackoff = 0
		cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", mosquitto6Line("alice", "pw-a")+mosquitto6Line("bob", "pw-b"))
		n := startNode(t, cfg)
		wrong := func(int) string { return "wrong" }
		alike(t, "unknown user against a wrong password",
			medianLogin(t, n, "nobody", tries, wrong), medianLogin(t, n, "alice", tries, wrong))
	})
	t.Run("repeated wrong password", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t)
		cfg.MQTT.LoginBackoff = 0
		cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "alice", "pw-a"))
		n := startNode(t, cfg)
		alike(t, "a repeated wrong password against new ones",
			medianLogin(t, n, "alice", tries, func(int) string { return "same" }),
			medianLogin(t, n, "alice", tries, func(i int) string { return fmt.Sprint("new-", i) }))
	})
}
