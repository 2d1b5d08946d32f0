import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from actors.broker.grpc.v2 import definition_pb2 as _definition_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueryRouteRequest(_message.Message):
    __slots__ = ("topic", "endpoints")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    topic: _definition_pb2.Resource
    endpoints: _definition_pb2.Endpoints
    def __init__(self, topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., endpoints: _Optional[_Union[_definition_pb2.Endpoints, _Mapping]] = ...) -> None: ...

class QueryRouteResponse(_message.Message):
    __slots__ = ("status", "message_queues")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_QUEUES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message_queues: _containers.RepeatedCompositeFieldContainer[_definition_pb2.MessageQueue]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message_queues: _Optional[_Iterable[_Union[_definition_pb2.MessageQueue, _Mapping]]] = ...) -> None: ...

class SendMessageRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_definition_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_definition_pb2.Message, _Mapping]]] = ...) -> None: ...

class SendResultEntry(_message.Message):
    __slots__ = ("status", "message_id", "transaction_id", "offset", "recall_handle")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message_id: str
    transaction_id: str
    offset: int
    recall_handle: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., offset: _Optional[int] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class SendMessageResponse(_message.Message):
    __slots__ = ("status", "entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    entries: _containers.RepeatedCompositeFieldContainer[SendResultEntry]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[SendResultEntry, _Mapping]]] = ...) -> None: ...

class QueryAssignmentRequest(_message.Message):
    __slots__ = ("topic", "group", "endpoints")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    topic: _definition_pb2.Resource
    group: _definition_pb2.Resource
    endpoints: _definition_pb2.Endpoints
    def __init__(self, topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., endpoints: _Optional[_Union[_definition_pb2.Endpoints, _Mapping]] = ...) -> None: ...

class QueryAssignmentResponse(_message.Message):
    __slots__ = ("status", "assignments")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    assignments: _containers.RepeatedCompositeFieldContainer[_definition_pb2.Assignment]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., assignments: _Optional[_Iterable[_Union[_definition_pb2.Assignment, _Mapping]]] = ...) -> None: ...

class ReceiveMessageRequest(_message.Message):
    __slots__ = ("group", "message_queue", "filter_expression", "batch_size", "invisible_duration", "auto_renew", "long_polling_timeout", "attempt_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    FILTER_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_FIELD_NUMBER: _ClassVar[int]
    AUTO_RENEW_FIELD_NUMBER: _ClassVar[int]
    LONG_POLLING_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    message_queue: _definition_pb2.MessageQueue
    filter_expression: _definition_pb2.FilterExpression
    batch_size: int
    invisible_duration: _duration_pb2.Duration
    auto_renew: bool
    long_polling_timeout: _duration_pb2.Duration
    attempt_id: str
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., message_queue: _Optional[_Union[_definition_pb2.MessageQueue, _Mapping]] = ..., filter_expression: _Optional[_Union[_definition_pb2.FilterExpression, _Mapping]] = ..., batch_size: _Optional[int] = ..., invisible_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., auto_renew: _Optional[bool] = ..., long_polling_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class ReceiveMessageResponse(_message.Message):
    __slots__ = ("status", "message", "delivery_timestamp")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message: _definition_pb2.Message
    delivery_timestamp: _timestamp_pb2.Timestamp
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message: _Optional[_Union[_definition_pb2.Message, _Mapping]] = ..., delivery_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AckMessageEntry(_message.Message):
    __slots__ = ("message_id", "receipt_handle", "lite_topic")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    receipt_handle: str
    lite_topic: str
    def __init__(self, message_id: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., lite_topic: _Optional[str] = ...) -> None: ...

class AckMessageRequest(_message.Message):
    __slots__ = ("group", "topic", "entries")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    topic: _definition_pb2.Resource
    entries: _containers.RepeatedCompositeFieldContainer[AckMessageEntry]
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[AckMessageEntry, _Mapping]]] = ...) -> None: ...

class AckMessageResultEntry(_message.Message):
    __slots__ = ("message_id", "receipt_handle", "status")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    receipt_handle: str
    status: _definition_pb2.Status
    def __init__(self, message_id: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class AckMessageResponse(_message.Message):
    __slots__ = ("status", "entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    entries: _containers.RepeatedCompositeFieldContainer[AckMessageResultEntry]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[AckMessageResultEntry, _Mapping]]] = ...) -> None: ...

class ForwardMessageToDeadLetterQueueRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle", "message_id", "delivery_attempt", "max_delivery_attempts", "lite_topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    topic: _definition_pb2.Resource
    receipt_handle: str
    message_id: str
    delivery_attempt: int
    max_delivery_attempts: int
    lite_topic: str
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., message_id: _Optional[str] = ..., delivery_attempt: _Optional[int] = ..., max_delivery_attempts: _Optional[int] = ..., lite_topic: _Optional[str] = ...) -> None: ...

class ForwardMessageToDeadLetterQueueResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group", "client_type")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    client_type: _definition_pb2.ClientType
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., client_type: _Optional[_Union[_definition_pb2.ClientType, str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("topic", "message_id", "transaction_id", "resolution", "source", "trace_context")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    topic: _definition_pb2.Resource
    message_id: str
    transaction_id: str
    resolution: _definition_pb2.TransactionResolution
    source: _definition_pb2.TransactionSource
    trace_context: str
    def __init__(self, topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., resolution: _Optional[_Union[_definition_pb2.TransactionResolution, str]] = ..., source: _Optional[_Union[_definition_pb2.TransactionSource, str]] = ..., trace_context: _Optional[str] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class PrintThreadStackTraceCommand(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    def __init__(self, nonce: _Optional[str] = ...) -> None: ...

class ReconnectEndpointsCommand(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    def __init__(self, nonce: _Optional[str] = ...) -> None: ...

class ThreadStackTrace(_message.Message):
    __slots__ = ("nonce", "thread_stack_trace")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    THREAD_STACK_TRACE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    thread_stack_trace: str
    def __init__(self, nonce: _Optional[str] = ..., thread_stack_trace: _Optional[str] = ...) -> None: ...

class VerifyMessageCommand(_message.Message):
    __slots__ = ("nonce", "message")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    message: _definition_pb2.Message
    def __init__(self, nonce: _Optional[str] = ..., message: _Optional[_Union[_definition_pb2.Message, _Mapping]] = ...) -> None: ...

class VerifyMessageResult(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    def __init__(self, nonce: _Optional[str] = ...) -> None: ...

class RecoverOrphanedTransactionCommand(_message.Message):
    __slots__ = ("message", "transaction_id")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    message: _definition_pb2.Message
    transaction_id: str
    def __init__(self, message: _Optional[_Union[_definition_pb2.Message, _Mapping]] = ..., transaction_id: _Optional[str] = ...) -> None: ...

class NotifyUnsubscribeLiteCommand(_message.Message):
    __slots__ = ("lite_topic",)
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    lite_topic: str
    def __init__(self, lite_topic: _Optional[str] = ...) -> None: ...

class TelemetryCommand(_message.Message):
    __slots__ = ("status", "settings", "thread_stack_trace", "verify_message_result", "recover_orphaned_transaction_command", "print_thread_stack_trace_command", "verify_message_command", "reconnect_endpoints_command", "notify_unsubscribe_lite_command")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    THREAD_STACK_TRACE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MESSAGE_RESULT_FIELD_NUMBER: _ClassVar[int]
    RECOVER_ORPHANED_TRANSACTION_COMMAND_FIELD_NUMBER: _ClassVar[int]
    PRINT_THREAD_STACK_TRACE_COMMAND_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MESSAGE_COMMAND_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_ENDPOINTS_COMMAND_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_UNSUBSCRIBE_LITE_COMMAND_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    settings: _definition_pb2.Settings
    thread_stack_trace: ThreadStackTrace
    verify_message_result: VerifyMessageResult
    recover_orphaned_transaction_command: RecoverOrphanedTransactionCommand
    print_thread_stack_trace_command: PrintThreadStackTraceCommand
    verify_message_command: VerifyMessageCommand
    reconnect_endpoints_command: ReconnectEndpointsCommand
    notify_unsubscribe_lite_command: NotifyUnsubscribeLiteCommand
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., settings: _Optional[_Union[_definition_pb2.Settings, _Mapping]] = ..., thread_stack_trace: _Optional[_Union[ThreadStackTrace, _Mapping]] = ..., verify_message_result: _Optional[_Union[VerifyMessageResult, _Mapping]] = ..., recover_orphaned_transaction_command: _Optional[_Union[RecoverOrphanedTransactionCommand, _Mapping]] = ..., print_thread_stack_trace_command: _Optional[_Union[PrintThreadStackTraceCommand, _Mapping]] = ..., verify_message_command: _Optional[_Union[VerifyMessageCommand, _Mapping]] = ..., reconnect_endpoints_command: _Optional[_Union[ReconnectEndpointsCommand, _Mapping]] = ..., notify_unsubscribe_lite_command: _Optional[_Union[NotifyUnsubscribeLiteCommand, _Mapping]] = ...) -> None: ...

class NotifyClientTerminationRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ...) -> None: ...

class NotifyClientTerminationResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class ChangeInvisibleDurationRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle", "invisible_duration", "message_id", "lite_topic", "suspend")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    topic: _definition_pb2.Resource
    receipt_handle: str
    invisible_duration: _duration_pb2.Duration
    message_id: str
    lite_topic: str
    suspend: bool
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., invisible_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., message_id: _Optional[str] = ..., lite_topic: _Optional[str] = ..., suspend: _Optional[bool] = ...) -> None: ...

class ChangeInvisibleDurationResponse(_message.Message):
    __slots__ = ("status", "receipt_handle")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    receipt_handle: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class PullMessageRequest(_message.Message):
    __slots__ = ("group", "message_queue", "offset", "batch_size", "filter_expression", "long_polling_timeout")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILTER_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    LONG_POLLING_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    message_queue: _definition_pb2.MessageQueue
    offset: int
    batch_size: int
    filter_expression: _definition_pb2.FilterExpression
    long_polling_timeout: _duration_pb2.Duration
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., message_queue: _Optional[_Union[_definition_pb2.MessageQueue, _Mapping]] = ..., offset: _Optional[int] = ..., batch_size: _Optional[int] = ..., filter_expression: _Optional[_Union[_definition_pb2.FilterExpression, _Mapping]] = ..., long_polling_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PullMessageResponse(_message.Message):
    __slots__ = ("status", "message", "next_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message: _definition_pb2.Message
    next_offset: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message: _Optional[_Union[_definition_pb2.Message, _Mapping]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class UpdateOffsetRequest(_message.Message):
    __slots__ = ("group", "message_queue", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    message_queue: _definition_pb2.MessageQueue
    offset: int
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., message_queue: _Optional[_Union[_definition_pb2.MessageQueue, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class UpdateOffsetResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class GetOffsetRequest(_message.Message):
    __slots__ = ("group", "message_queue")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    message_queue: _definition_pb2.MessageQueue
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., message_queue: _Optional[_Union[_definition_pb2.MessageQueue, _Mapping]] = ...) -> None: ...

class GetOffsetResponse(_message.Message):
    __slots__ = ("status", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    offset: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("message_queue", "query_offset_policy", "timestamp")
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUERY_OFFSET_POLICY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    message_queue: _definition_pb2.MessageQueue
    query_offset_policy: _definition_pb2.QueryOffsetPolicy
    timestamp: _timestamp_pb2.Timestamp
    def __init__(self, message_queue: _Optional[_Union[_definition_pb2.MessageQueue, _Mapping]] = ..., query_offset_policy: _Optional[_Union[_definition_pb2.QueryOffsetPolicy, str]] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QueryOffsetResponse(_message.Message):
    __slots__ = ("status", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    offset: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class RecallMessageRequest(_message.Message):
    __slots__ = ("topic", "recall_handle")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    topic: _definition_pb2.Resource
    recall_handle: str
    def __init__(self, topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class RecallMessageResponse(_message.Message):
    __slots__ = ("status", "message_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message_id: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message_id: _Optional[str] = ...) -> None: ...

class SyncLiteSubscriptionRequest(_message.Message):
    __slots__ = ("action", "topic", "group", "lite_topic_set", "version", "offset_option")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_SET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_OPTION_FIELD_NUMBER: _ClassVar[int]
    action: _definition_pb2.LiteSubscriptionAction
    topic: _definition_pb2.Resource
    group: _definition_pb2.Resource
    lite_topic_set: _containers.RepeatedScalarFieldContainer[str]
    version: int
    offset_option: _definition_pb2.OffsetOption
    def __init__(self, action: _Optional[_Union[_definition_pb2.LiteSubscriptionAction, str]] = ..., topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., lite_topic_set: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ..., offset_option: _Optional[_Union[_definition_pb2.OffsetOption, _Mapping]] = ...) -> None: ...

class SyncLiteSubscriptionResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...
