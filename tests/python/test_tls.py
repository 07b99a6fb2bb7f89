"""TLS and mutual TLS on the gRPC port, with certificates made by the
`openssl` CLI in tmp_path and real grpcio clients (docs/api.md, "Services";
README flags --tls-cert/--tls-key/--tls-client-ca)."""
import subprocess

import grpc
import pytest


def openssl(*args, cwd):
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"openssl {' '.join(args)}:\n{out.stderr}"


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d, name, ca, extensions):
    (d / f"{name}.ext").write_text(extensions)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
            "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_ca(d, "other-ca")  # a CA nobody trusts
    make_leaf(d, "server", "ca",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    make_leaf(d, "client", "ca",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n")
    make_leaf(d, "rogue-client", "other-ca",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n")
    return d


def read(d, name):
    return (d / name).read_bytes()


def model_info(pb, target, credentials):
    pb2, pb2_grpc = pb
    with grpc.secure_channel(target, credentials) as channel:
        return pb2_grpc.GenerationStub(channel).GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)


def expect_refused(pb, target, credentials):
    with pytest.raises(grpc.RpcError) as err:
        model_info(pb, target, credentials)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()


def test_tls(start_server, model_path, pb, certs):
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", f"--tls-cert={certs / 'server.pem'}",
                           f"--tls-key={certs / 'server.key'}"], wait=False)
    trusted = grpc.ssl_channel_credentials(root_certificates=read(certs, "ca.pem"))
    server.wait_serving(credentials=trusted)  # health over TLS

    info = model_info(pb, server.target, trusted)
    assert info.vocab_size == 49152
    with grpc.secure_channel(server.target, trusted) as ch:
        r = pb2_grpc.GenerationStub(ch).Generate(
            pb2.GenerateRequest(prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=2)),
            timeout=60)
        assert len(r.token_ids) >= 1

    # The certificate is checked against the host name too: a name in its
    # subjectAltName (DNS:localhost) is accepted, whether dialled or set as the
    # name the client checks, and a trusted certificate for another name is
    # refused.
    with grpc.secure_channel(f"localhost:{server.port}", trusted) as ch:
        pb2_grpc.GenerationStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
    with grpc.secure_channel(server.target, trusted,
                             options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        pb2_grpc.GenerationStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
    with grpc.secure_channel(server.target, trusted,
                             options=[("grpc.ssl_target_name_override", "elsewhere.example")]) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb2_grpc.GenerationStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert "Hostname Verification" in err.value.details(), err.value.details()

    # No CA (the system roots do not know ours) and a wrong CA both fail.
    expect_refused(pb, server.target, grpc.ssl_channel_credentials())
    expect_refused(pb, server.target,
                   grpc.ssl_channel_credentials(root_certificates=read(certs, "other-ca.pem")))
    # A plaintext client cannot talk to a TLS port.
    with grpc.insecure_channel(server.target) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb2_grpc.GenerationStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert '"tls":true' in server.logs().replace(" ", "")


def test_mutual_tls(start_server, model_path, pb, certs):
    server = start_server([f"--model={model_path}", f"--tls-cert={certs / 'server.pem'}",
                           f"--tls-key={certs / 'server.key'}",
                           f"--tls-client-ca={certs / 'ca.pem'}"], wait=False)
    ca = read(certs, "ca.pem")
    with_cert = grpc.ssl_channel_credentials(root_certificates=ca,
                                             private_key=read(certs, "client.key"),
                                             certificate_chain=read(certs, "client.pem"))
    server.wait_serving(credentials=with_cert)  # health over mutual TLS

    assert model_info(pb, server.target, with_cert).vocab_size == 49152
    # Right server CA but no client certificate: refused.
    expect_refused(pb, server.target, grpc.ssl_channel_credentials(root_certificates=ca))
    # A client certificate signed by a CA the server does not trust: refused.
    rogue = grpc.ssl_channel_credentials(root_certificates=ca,
                                         private_key=read(certs, "rogue-client.key"),
                                         certificate_chain=read(certs, "rogue-client.pem"))
    expect_refused(pb, server.target, rogue)
    assert '"mtls":true' in server.logs().replace(" ", "")
