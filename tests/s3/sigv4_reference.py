"""Reference SigV4 signatures and presigned URLs from boto3/botocore, for storage_test's S3SigV4 cross-check.

Reads a JSON list of cases from argv[1]; prints one line per result, tab-separated:
  <id>  URL     <url>                      the request URL boto3 sent / the presigned URL it generated
  <id>  HEADER  <lowercase name>  <value>  each header of the signed request (requests only)
Time is fixed by replacing botocore.auth.get_current_datetime; no network is used (requests are captured in
before-send and never sent).
"""
import datetime
import json
import sys

import boto3
import botocore.auth
from botocore.config import Config


class Captured(Exception):
    def __init__(self, request):
        super().__init__("captured")
        self.request = request


def capture(request, **_):
    raise Captured(request)


def make_client(case):
    s3_config = {"addressing_style": case["addressing"]}
    if case.get("unsigned_payload"):
        s3_config["payload_signing_enabled"] = False
    config = Config(
        signature_version="s3v4",
        s3=s3_config,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 1},
    )
    session = boto3.session.Session(
        aws_access_key_id=case["access_key"],
        aws_secret_access_key=case["secret_key"],
        aws_session_token=case.get("token") or None,
        region_name=case["region"],
    )
    client = session.client("s3", endpoint_url=case["endpoint"], config=config)
    # SDK bookkeeping headers are not part of what we compare: drop them before signing.
    def drop_sdk_headers(request, **_):
        for name in ("amz-sdk-invocation-id", "amz-sdk-request"):
            if name in request.headers:
                del request.headers[name]
    client.meta.events.register_first("before-sign.s3.*", drop_sdk_headers)
    client.meta.events.register("before-send.s3.*", capture)
    return client


def operation(case):
    params = {"Bucket": case["bucket"], "Key": case["key"]}
    method = case["method"]
    if case.get("upload_id"):
        params["UploadId"] = case["upload_id"]
        params["PartNumber"] = case["part_number"]
        name = "upload_part"
    else:
        name = {"GET": "get_object", "PUT": "put_object", "HEAD": "head_object", "DELETE": "delete_object"}[method]
    if name in ("put_object", "upload_part") and case["kind"] == "request":
        params["Body"] = case.get("body", "").encode()
    header_params = {"if-none-match": "IfNoneMatch", "content-type": "ContentType", "range": "Range"}
    for name_value in case.get("headers", []):
        header, value = name_value[0].lower(), name_value[1]
        if header in header_params:
            params[header_params[header]] = value
        elif header.startswith("x-amz-meta-"):
            params.setdefault("Metadata", {})[header[len("x-amz-meta-"):]] = value
        else:
            raise ValueError("no boto3 parameter for header " + header)
    return name, params


def main():
    cases = json.load(open(sys.argv[1]))
    out = []
    for case in cases:
        fixed = datetime.datetime.strptime(case["time"], "%Y%m%dT%H%M%SZ")
        botocore.auth.get_current_datetime = lambda *a, **k: fixed
        client = make_client(case)
        name, params = operation(case)
        if case["kind"] == "presign":
            url = client.generate_presigned_url(name, Params=params, ExpiresIn=case["expires"])
            out.append(f"{case['id']}\tURL\t{url}")
            continue
        try:
            getattr(client, name)(**params)
            raise RuntimeError("request was not captured")
        except Captured as c:
            out.append(f"{case['id']}\tURL\t{c.request.url}")
            for header, value in c.request.headers.items():
                if isinstance(value, bytes):
                    value = value.decode()
                out.append(f"{case['id']}\tHEADER\t{header.lower()}\t{value}")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
