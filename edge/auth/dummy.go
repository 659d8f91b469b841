package auth

import (
	"crypto/rand"
	"fmt"
	"sync"

	"golang.org/x/crypto/bcrypt"
)

// A login for a user name the file does not list is checked against a
// dummy hash, so that it takes as long as a wrong password for a listed
// user: the dummy is of the kind and cost most of the file's users have
// (mosquitto_passwd's $7$ lines cost a fraction of a millisecond, Peat's
// argon2id 14 ms: a fixed dummy would tell which names exist). It is
// made once per file, on the first unknown name, with a random salt and
// key, so no password matches it. A file that mixes kinds still tells
// the minority's names apart from unknown ones.

// dummy is a users file's dummy hash, made on first use.
type dummy struct {
	once sync.Once
	h    hash
}

// dummyFor returns us's dummy hash, or fallback when us has no user or
// the dummy cannot be made.
func (us *Users) dummyFor(fallback hash) hash {
	us.dummy.once.Do(func() {
		us.dummy.h, _ = likeMost(us.m)
	})
	if us.dummy.h == nil {
		return fallback
	}
	return us.dummy.h
}

// likeMost makes a hash no password matches, of the kind and cost most
// of users' hashes have.
func likeMost(users map[string]user) (hash, error) {
	count := map[string]int{}
	first := map[string]hash{}
	best := ""
	for _, u := range users {
		k := costKey(u.h)
		count[k]++
		if first[k] == nil {
			first[k] = u.h
		}
		if best == "" || count[k] > count[best] || count[k] == count[best] && k < best {
			best = k
		}
	}
	if best == "" {
		return nil, fmt.Errorf("auth: no users")
	}
	return dummyLike(first[best])
}

// costKey names a hash's kind and cost parameters.
func costKey(h hash) string {
	switch h := h.(type) {
	case argon2idHash:
		return fmt.Sprintf("argon2id m=%d t=%d p=%d len=%d", h.memory, h.time, h.threads, len(h.key))
	case bcryptHash:
		c, _ := bcrypt.Cost([]byte(h))
		return fmt.Sprintf("bcrypt %d", c)
	case mosquittoHash:
		return fmt.Sprintf("mosquitto i=%d", h.iterations)
	}
	return fmt.Sprintf("%T", h)
}

// dummyLike makes a hash of h's kind and cost with a random salt and key.
func dummyLike(h hash) (hash, error) {
	random := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return b
	}
	switch h := h.(type) {
	case argon2idHash:
		h.salt, h.key = random(len(h.salt)), random(len(h.key))
		return h, nil
	case bcryptHash:
		c, err := bcrypt.Cost([]byte(h))
		if err != nil {
			return nil, err
		}
		b, err := bcrypt.GenerateFromPassword(random(32), c)
		return bcryptHash(b), err
	case mosquittoHash:
		h.salt, h.key = random(len(h.salt)), random(len(h.key))
		return h, nil
	}
	return nil, fmt.Errorf("auth: no dummy for %T", h)
}
