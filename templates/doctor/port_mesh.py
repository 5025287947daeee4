# On every node at once: listen on PORT, a port of the ephemeral range that NCCL and gloo
# bind their connections in, and connect to every peer's listener on the same port.
# argv[1]: "PORT LIMIT PEER..." (PEER: a cluster address). Prints "port PORT", "range LOW
# HIGH" (this node's ip_local_port_range), "listen ok|busy|error WHY", then "peer ADDRESS open|
# stalled MSS|timeout|refused|error WHY" per peer. A refusal is retried until LIMIT, since a
# peer's listener may still be starting; the listener stays up until every peer has
# connected, or LIMIT + LATE_S have passed (a peer whose probe started later still gets
# its turn). Once connected, one full-size segment (the connection's MSS) goes across and
# the peer answers with what it received: "stalled" when no answer came in TRANSFER_S,
# as where a switch between two jumbo-frame nodes drops their full-size packets silently.
# The listening side closes first, so the TIME_WAIT each connection leaves for a minute
# is on its side, on the listening port: one left on a connecting side's ephemeral port
# would make a later run that draws that port unable to listen on it (EADDRINUSE).
import errno
import socket
import sys
import threading
import time

RETRY_S = 0.05
LATE_S = 2.0
TRANSFER_S = 2.0
LARGEST_SEGMENT = 65535  # what a peer may announce; anything else is no peer's

port_text, limit_text, *peers = sys.argv[1].split()
port, limit = int(port_text), float(limit_text)
started = time.time()
deadline = started + limit
print("port", port)
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        print("range", *ranges.read().split())
except OSError:
    pass

server = None
try:
    if socket.has_dualstack_ipv6():
        server = socket.create_server(("", port), family=socket.AF_INET6,
                                      dualstack_ipv6=True)
    else:
        server = socket.create_server(("", port))
    print("listen ok")
except OSError as error:
    print("listen", "busy" if error.errno == errno.EADDRINUSE
          else f"error {error.strerror or error}")
sys.stdout.flush()


def answer(peer: socket.socket) -> None:
    """Tell a connected peer how many bytes it sent ("SIZE\\n", then SIZE bytes), once
    it has sent them all. Counted, not kept; a connection that does not say a size first
    (not a peer's) is closed unanswered and takes no peer's place."""
    head, size, received = b"", 0, 0
    peer.settimeout(TRANSFER_S + 1)  # the sender gives up first, and says so
    try:
        while not size or received < size:
            data = peer.recv(65536)
            if not data:
                return
            if size:
                received += len(data)
                continue
            head += data
            line, newline, body = head.partition(b"\n")
            if not newline:
                if len(head) > len(str(LARGEST_SEGMENT)):
                    return
                continue
            if not line.isdigit() or not 0 < int(line) <= LARGEST_SEGMENT:
                return
            size, received = int(line), len(body)
            peers_seen.append(peer)
            if len(peers_seen) >= len(peers):
                every_peer_seen.set()
        peer.sendall(str(received).encode())
    except OSError:
        pass
    finally:
        peer.close()


answering: list = []  # a thread per accepted connection
peers_seen: list = []  # the peers' among them: they said a size
every_peer_seen = threading.Event()  # what the end waits for, not the accept loop's poll


def accept_peers() -> None:
    server.settimeout(0.1)
    # Until every peer has said its size; strangers' connections take no peer's place,
    # and are not accepted without end.
    while len(peers_seen) < len(peers) and len(answering) < 4 * len(peers) + 16 \
            and time.time() < deadline + LATE_S:
        try:
            thread = threading.Thread(target=answer, args=(server.accept()[0],), daemon=True)
        except socket.timeout:  # noqa: UP041 - a node's python may be older than 3.10
            continue
        except OSError:
            break
        answering.append(thread)  # listed before it runs: the end joins every answer owed
        thread.start()


def across(connection: socket.socket) -> str:
    """One full-size segment to the peer, and its answer: open, or stalled MSS (no
    answer in time: the peer answers only once the segment has arrived)."""
    try:
        size = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        size = 1400
    connection.settimeout(TRANSFER_S)
    answer = b""
    try:
        # The size alone first, a small packet that arrives whatever the path's MTU: the
        # peer knows a peer connected even when the full-size segment is lost.
        connection.sendall(str(size).encode() + b"\n")
        connection.sendall(bytes(size))
        while True:  # until the peer, having answered, closes
            data = connection.recv(32)
            if not data:
                break
            answer += data
    except OSError:
        pass
    finally:
        connection.close()
    return "open" if answer.strip().isdigit() else f"stalled {size}"


def reach(peer: str, said: dict) -> None:
    while True:
        try:
            connection = socket.create_connection((peer, port),
                                                  timeout=max(0.1, deadline - time.time()))
            said[peer] = across(connection)
        except socket.timeout:  # noqa: UP041 - TimeoutError only from Python 3.10 on
            said[peer] = "timeout"
        except ConnectionRefusedError:
            if time.time() + RETRY_S < deadline:
                time.sleep(RETRY_S)
                continue
            said[peer] = "refused"
        except OSError as error:
            said[peer] = f"error {error.strerror or error}"
        return


listener = threading.Thread(target=accept_peers, daemon=True) if server else None
if listener:
    listener.start()
said: dict = {}
threads = [threading.Thread(target=reach, args=(peer, said), daemon=True) for peer in peers]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(limit + TRANSFER_S + 1)
for peer in peers:
    print("peer", peer, said.get(peer, "timeout"))
sys.stdout.flush()
if listener:
    every_peer_seen.wait(max(0.0, deadline + LATE_S - time.time()))
for thread in answering:  # a peer still owed its answer
    thread.join(max(0.0, deadline + LATE_S + TRANSFER_S + 1 - time.time()))
