// A sarama 1.22 consumer (Debian's golang-github-shopify-sarama-dev) that
// reads up to -max records of one partition, commits what it read and exits,
// for tests/e2e/test_older_clients.py. Run it twice: the second run must
// start where the first committed.
//
// sarama 1.x commits with OffsetCommit v1 whatever its configured Version
// (v2 only when Consumer.Offsets.Retention is set), so this exercises the
// pre-KIP-896 versions kaas serves again. The config is sarama's default
// except Version: the default (0.8.2) would send Produce v0 and Fetch v0,
// which need the magic 0/1 message format that kaas, like Kafka 4, does
// not serve; 0.11.0 is the oldest setting whose Fetch (v4) kaas serves.
//
// Modes:
//
//	-mode offset-manager   a standalone consumer with sarama's OffsetManager
//	                       (generation -1, no member: a "simple" commit)
//	-mode group            a ConsumerGroup member (generation and member id)
//
// Prints one JSON line: {"first": <offset of the first record read, -1 for
// none>, "count": n, "commit_errors": [...]}. Exits 2 when a commit failed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

type result struct {
	First        int64    `json:"first"`
	Count        int      `json:"count"`
	CommitErrors []string `json:"commit_errors"`
}

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "bootstrap broker")
	topic := flag.String("topic", "", "topic (partition 0 is read)")
	group := flag.String("group", "", "consumer group")
	mode := flag.String("mode", "offset-manager", "offset-manager or group")
	max := flag.Int("max", 10, "records to read before committing and exiting")
	idle := flag.Duration("idle", 10*time.Second, "give up after this long without a record")
	verbose := flag.Bool("v", false, "sarama's log on stderr")
	flag.Parse()

	if *verbose {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags)
	}
	config := sarama.NewConfig()
	config.Version = sarama.V0_11_0_0
	config.ClientID = "sarama-e2e"
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Return.Errors = true

	client, err := sarama.NewClient([]string{*brokers}, config)
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()

	var res result
	switch *mode {
	case "offset-manager":
		res = offsetManager(client, *topic, *group, *max, *idle)
	case "group":
		res = consumerGroup(client, *topic, *group, *max, *idle)
	default:
		fail("unknown mode %q", *mode)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if len(res.CommitErrors) > 0 {
		os.Exit(2)
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func offsetManager(client sarama.Client, topic, group string, max int, idle time.Duration) result {
	res := result{First: -1, CommitErrors: []string{}}
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		fail("offset manager: %v", err)
	}
	pom, err := om.ManagePartition(topic, 0)
	if err != nil {
		fail("manage partition: %v", err)
	}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		for e := range pom.Errors() {
			mu.Lock()
			res.CommitErrors = append(res.CommitErrors, e.Error())
			mu.Unlock()
		}
		close(done)
	}()
	next, _ := pom.NextOffset()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		fail("consumer: %v", err)
	}
	pc, err := consumer.ConsumePartition(topic, 0, next)
	if err != nil {
		fail("consume partition from %d: %v", next, err)
	}
read:
	for res.Count < max {
		select {
		case m := <-pc.Messages():
			if res.First < 0 {
				res.First = m.Offset
			}
			res.Count++
			pom.MarkOffset(m.Offset+1, "")
		case e := <-pc.Errors():
			fail("fetch: %v", e)
		case <-time.After(idle):
			break read
		}
	}
	pc.Close()
	consumer.Close()
	// Closing flushes the marked offset: OffsetCommit v1. sarama retries a
	// commit that fails on a closed connection without end: give up after
	// a while and say so.
	closed := make(chan struct{})
	go func() {
		pom.Close()
		om.Close()
		close(closed)
	}()
	select {
	case <-closed:
		<-done
	case <-time.After(30 * time.Second):
		mu.Lock()
		res.CommitErrors = append(res.CommitErrors, "offset manager close (the final commit) did not finish in 30s")
		mu.Unlock()
	}
	return res
}

type handler struct {
	max  int
	res  *result
	stop context.CancelFunc
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		if m.Partition != 0 || h.res.Count >= h.max {
			continue
		}
		if h.res.First < 0 {
			h.res.First = m.Offset
		}
		h.res.Count++
		sess.MarkMessage(m, "")
		if h.res.Count >= h.max {
			h.stop()
		}
	}
	return nil
}

func consumerGroup(client sarama.Client, topic, group string, max int, idle time.Duration) result {
	res := result{First: -1, CommitErrors: []string{}}
	g, err := sarama.NewConsumerGroupFromClient(group, client)
	if err != nil {
		fail("consumer group: %v", err)
	}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		for e := range g.Errors() {
			mu.Lock()
			res.CommitErrors = append(res.CommitErrors, e.Error())
			mu.Unlock()
		}
		close(done)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	h := &handler{max: max, res: &res, stop: cancel}
	// Give up when no record arrives for `idle` (checked coarsely).
	go func() {
		last := -1
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(idle):
				if res.Count == last {
					cancel()
					return
				}
				last = res.Count
			}
		}
	}()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{topic}, h); err != nil {
			fail("consume: %v", err)
		}
	}
	// Closing ends the session, which flushes the marked offsets with the
	// member's generation: OffsetCommit v1.
	closeErr := g.Close()
	<-done
	if closeErr != nil {
		res.CommitErrors = append(res.CommitErrors, closeErr.Error())
	}
	return res
}
