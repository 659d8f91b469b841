package auth

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
)

// Users are the accounts of a users file: one "name:hash" line each, the
// format of Mosquitto's password file, so a file mosquitto_passwd wrote
// can be used as it is. Blank lines and lines starting with # are
// skipped.
type Users struct {
	m     map[string]user
	dummy dummy // checked for unknown names (dummy.go)
}

type user struct {
	raw string // the hash as written: part of the verification cache's key
	h   hash
}

// ParseUsers reads a users file. Every problem is reported with its line
// number (never the hash); a file with any problem is refused as a whole.
func ParseUsers(r io.Reader) (*Users, error) {
	us := &Users{m: map[string]user{}}
	var probs []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, raw, ok := strings.Cut(line, ":")
		switch {
		case !ok || name == "":
			probs = append(probs, fmt.Sprintf("line %d: want name:hash", n))
			continue
		case us.m[name].h != nil:
			probs = append(probs, fmt.Sprintf("line %d: user %q listed twice", n, name))
			continue
		}
		h, err := parseHash(raw)
		if err != nil {
			probs = append(probs, fmt.Sprintf("line %d: user %q: %v", n, name, err))
			continue
		}
		us.m[name] = user{raw: raw, h: h}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return us, nil
}

// Len is the number of users.
func (us *Users) Len() int { return len(us.m) }

// verifier checks passwords against Users with two bounds for a
// reconnect storm (1,000 sensors coming back after an outage): at most
// limit hashes run at once, so connected clients keep a core; and a cache
// of recent answers, so a device that reconnects with the same password
// costs one hash, not one per connection. The cache holds an HMAC (under
// a key made at start) of the user, the stored hash and the password,
// never the password; a changed hash in the file is a new key.
type verifier struct {
	sem   chan struct{}
	key   []byte
	dummy hash // for unknown users when the file has no hash to copy (dummy.go)

	mu struct {
		sync.Mutex
		cache map[[sha256.Size]byte]bool // right passwords only
	}
}

// verifyCacheSize bounds the cache; when full it starts again empty.
const verifyCacheSize = 4096

func newVerifier(limit int) (*verifier, error) {
	if limit <= 0 {
		limit = max(1, runtime.GOMAXPROCS(0)-1)
	}
	v := &verifier{sem: make(chan struct{}, limit), key: make([]byte, 32)}
	if _, err := rand.Read(v.key); err != nil {
		return nil, fmt.Errorf("auth: random key: %w", err)
	}
	raw, err := HashPassword("peat-dummy")
	if err != nil {
		return nil, err
	}
	if v.dummy, err = parseHash(raw); err != nil {
		return nil, err
	}
	v.mu.cache = map[[sha256.Size]byte]bool{}
	return v, nil
}

// verify reports whether password is name's in us.
func (v *verifier) verify(us *Users, name string, password []byte) bool {
	u, known := us.m[name]
	if !known {
		v.hashOne(us.dummyFor(v.dummy), password)
		return false
	}
	mac := hmac.New(sha256.New, v.key)
	fmt.Fprintf(mac, "%d:%s:%d:%s:", len(name), name, len(u.raw), u.raw)
	mac.Write(password)
	var k [sha256.Size]byte
	mac.Sum(k[:0])
	v.mu.Lock()
	ok, hit := v.mu.cache[k]
	v.mu.Unlock()
	if hit {
		return ok
	}
	ok = v.hashOne(u.h, password)
	if !ok {
		// Only right passwords are kept: a wrong one answered from the
		// cache would come back faster than the first time, telling a
		// guesser which names it tried exist.
		return false
	}
	v.mu.Lock()
	if len(v.mu.cache) >= verifyCacheSize {
		clear(v.mu.cache)
	}
	v.mu.cache[k] = true
	v.mu.Unlock()
	return true
}

// hashOne runs one verification, waiting for a slot.
func (v *verifier) hashOne(h hash, password []byte) bool {
	v.sem <- struct{}{}
	defer func() { <-v.sem }()
	return h.verify(password)
}
