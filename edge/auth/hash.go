package auth

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Argon2id parameters of the hashes `peat passwd` writes: 14 ms on the
// 2-core x86 test machine (FACTS.md), a few times that on a Pi Zero, where
// the verification cache and MaxConcurrentHashes keep a reconnect storm
// from taking every core.
const (
	argonTime    = 3
	argonMemory  = 8 << 10 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// HashPassword returns the argon2id hash of password in the PHC string
// format ($argon2id$v=19$m=...,t=...,p=...$salt$hash), as a users file
// line holds it.
func HashPassword(password string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("auth: salt: %w", err)
	}
	key := argon2.IDKey([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// hash is one parsed password hash of a users file.
type hash interface {
	verify(password []byte) bool
}

// parseHash reads a hash in one of the formats a users file may hold:
// argon2id (PHC string), bcrypt ($2a$, $2b$, $2y$), and the two that
// Mosquitto's mosquitto_passwd writes: $6$ (one SHA-512 of the password
// and salt, Mosquitto 1.x) and $7$ (PBKDF2-SHA512, Mosquitto 2).
// A plain-text password is refused: a file that holds one fails to load.
func parseHash(s string) (hash, error) {
	switch {
	case strings.HasPrefix(s, "$argon2id$"):
		return parseArgon2id(s)
	case strings.HasPrefix(s, "$2a$"), strings.HasPrefix(s, "$2b$"), strings.HasPrefix(s, "$2y$"):
		if _, err := bcrypt.Cost([]byte(s)); err != nil {
			return nil, fmt.Errorf("bcrypt hash: %w", err)
		}
		return bcryptHash(s), nil
	case strings.HasPrefix(s, "$6$"):
		return parseMosquitto6(s)
	case strings.HasPrefix(s, "$7$"):
		return parseMosquitto7(s)
	}
	return nil, fmt.Errorf("not a password hash peat knows (argon2id, bcrypt, or mosquitto_passwd's $6$ or $7$); write it with `peat passwd`")
}

type argon2idHash struct {
	time, memory uint32
	threads      uint8
	salt, key    []byte
}

func parseArgon2id(s string) (hash, error) {
	// $argon2id$v=19$m=8192,t=3,p=1$salt$key
	parts := strings.Split(s, "$")
	if len(parts) != 6 || parts[2] != fmt.Sprintf("v=%d", argon2.Version) {
		return nil, fmt.Errorf("argon2id hash: want $argon2id$v=%d$m=..,t=..,p=..$salt$hash", argon2.Version)
	}
	var h argon2idHash
	var threads uint32
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &h.memory, &h.time, &threads); err != nil {
		return nil, fmt.Errorf("argon2id parameters %q: %w", parts[3], err)
	}
	// Bounds keep a hostile file from making each verification take a
	// gigabyte or a minute.
	if h.memory < 8 || h.memory > 64<<10 || h.time < 1 || h.time > 32 || threads < 1 || threads > 16 {
		return nil, fmt.Errorf("argon2id parameters %q out of range (m 8..65536 KiB, t 1..32, p 1..16)", parts[3])
	}
	h.threads = uint8(threads)
	var err error
	if h.salt, err = base64.RawStdEncoding.DecodeString(parts[4]); err != nil || len(h.salt) < 8 {
		return nil, fmt.Errorf("argon2id salt: not base64 of at least 8 bytes")
	}
	if h.key, err = base64.RawStdEncoding.DecodeString(parts[5]); err != nil || len(h.key) < 16 || len(h.key) > 64 {
		return nil, fmt.Errorf("argon2id hash: not base64 of 16 to 64 bytes")
	}
	return h, nil
}

func (h argon2idHash) verify(pw []byte) bool {
	key := argon2.IDKey(pw, h.salt, h.time, h.memory, h.threads, uint32(len(h.key)))
	return subtle.ConstantTimeCompare(key, h.key) == 1
}

type bcryptHash string

func (h bcryptHash) verify(pw []byte) bool {
	return bcrypt.CompareHashAndPassword([]byte(h), pw) == nil // constant time inside
}

// mosquittoHash is $6$salt$hash (iterations 0: one SHA-512 of password
// then salt) or $7$iterations$salt$hash (PBKDF2-SHA512), salt and hash in
// padded base64.
type mosquittoHash struct {
	iterations int
	salt, key  []byte
}

func parseMosquitto6(s string) (hash, error) {
	parts := strings.Split(s, "$")
	if len(parts) != 4 {
		return nil, fmt.Errorf("$6$ hash: want $6$salt$hash")
	}
	return mosquittoParts(0, parts[2], parts[3], 64)
}

func parseMosquitto7(s string) (hash, error) {
	parts := strings.Split(s, "$")
	if len(parts) != 5 {
		return nil, fmt.Errorf("$7$ hash: want $7$iterations$salt$hash")
	}
	n, err := strconv.Atoi(parts[2])
	if err != nil || n < 1 || n > 10_000_000 {
		return nil, fmt.Errorf("$7$ hash: iterations %q: want 1 to 10000000", parts[2])
	}
	return mosquittoParts(n, parts[3], parts[4], 64)
}

func mosquittoParts(iterations int, salt, key string, keyLen int) (hash, error) {
	h := mosquittoHash{iterations: iterations}
	var err error
	if h.salt, err = base64.StdEncoding.DecodeString(salt); err != nil || len(h.salt) == 0 {
		return nil, fmt.Errorf("mosquitto hash: salt is not base64")
	}
	if h.key, err = base64.StdEncoding.DecodeString(key); err != nil || len(h.key) != keyLen {
		return nil, fmt.Errorf("mosquitto hash: hash is not base64 of %d bytes", keyLen)
	}
	return h, nil
}

func (h mosquittoHash) verify(pw []byte) bool {
	var key []byte
	if h.iterations == 0 {
		d := sha512.New()
		d.Write(pw)
		d.Write(h.salt)
		key = d.Sum(nil)
	} else {
		var err error
		key, err = pbkdf2.Key(sha512.New, string(pw), h.salt, h.iterations, len(h.key))
		if err != nil {
			return false
		}
	}
	return subtle.ConstantTimeCompare(key, h.key) == 1
}
