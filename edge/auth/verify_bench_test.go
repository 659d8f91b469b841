package auth

import (
	"crypto/pbkdf2"
	"crypto/sha512"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// mosquitto7 is a $7$ line of mosquitto_passwd (PBKDF2-SHA512, its
// default 101 iterations).
func mosquitto7(tb testing.TB, name, pw string) string {
	tb.Helper()
	salt := []byte("0123456789abcdef")
	key, err := pbkdf2.Key(sha512.New, pw, salt, 101, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("%s:$7$101$%s$%s\n", name, base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(key))
}

// A refused login costs the same whatever it got wrong: compare the
// ns/op of the sub-benchmarks of one kind (benchstat). A wrong password
// tried again is hashed again, and an unknown name costs a hash of the
// file's kind.
func BenchmarkVerify_Refused(b *testing.B) {
	argon, err := HashPassword("right")
	if err != nil {
		b.Fatal(err)
	}
	files := map[string]string{
		"argon2id":   "alice:" + argon + "\n",
		"mosquitto7": mosquitto7(b, "alice", "right"),
	}
	for kind, file := range files {
		us, err := ParseUsers(strings.NewReader(file))
		if err != nil {
			b.Fatal(err)
		}
		v, err := newVerifier(1)
		if err != nil {
			b.Fatal(err)
		}
		cases := []struct {
			name, user string
			pw         func(i int) []byte
		}{
			{"new_wrong_password", "alice", func(i int) []byte { return fmt.Appendf(nil, "guess-%d", i) }},
			{"repeated_wrong_password", "alice", func(int) []byte { return []byte("guess") }},
			{"unknown_user", "nobody", func(int) []byte { return []byte("guess") }},
		}
		for _, c := range cases {
			b.Run(kind+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if v.verify(us, c.user, c.pw(i)) {
						b.Fatal("a wrong password verified")
					}
				}
			})
		}
	}
}
